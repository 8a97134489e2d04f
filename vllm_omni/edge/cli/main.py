"""``vllm-omni-edge`` (``python -m vllm_omni.edge``): one command, a subcommand per job, one module per subcommand.

    vllm-omni-edge build --hardware CLASS --model DIR_OR_ID --out DIR [--target rk3588]
    vllm-omni-edge plan validate|show DIR
    vllm-omni-edge hardware list|detect
    vllm-omni-edge export --model DIR_OR_ID --out-dir DIR        (also python -m vllm_omni.edge.decoder_export)
    vllm-omni-edge client --server URL --hardware CLASS --text "..." --out speech.wav
    vllm-omni-edge codec-stream record|inspect ...
    vllm-omni-edge rknn-convert --onnx step.onnx --output step.rknn   (converter venv; also the tools/rknn script)

``build`` makes every artifact of the class, verifies each in its runtime, and writes
``DIR/exec_plan.json``; a re-run keeps artifacts that are already built and intact. Exit codes:
0 success, 1 a failed build or an invalid plan (one ``error:`` line says which artifact and
field), 2 bad arguments. ``export``, ``client``, ``codec-stream`` and ``rknn-convert`` have parsers and
exit codes of their own (``vllm-omni-edge SUBCOMMAND --help``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from ..errors import EdgeError
from .build import BuildSubcommand
from .hardware import HardwareSubcommand
from .plan import PlanSubcommand
from .types import CLISubcommand

PROG = "vllm-omni-edge"
SUBCOMMANDS: tuple[CLISubcommand, ...] = (BuildSubcommand(), PlanSubcommand(), HardwareSubcommand())


def _export() -> Callable[..., int]:
    from .export import main

    return main


def _client() -> Callable[..., int]:
    from .client import main

    return main


def _codec_stream() -> Callable[..., int]:
    from .codec_stream import main

    return main


def _rknn_convert() -> Callable[..., int]:
    from .rknn_convert import main

    return main


# Subcommands whose module parses its own arguments (``main(argv, prog)``, imported when the subcommand runs):
# name -> (that main, help).
OWN_PARSERS: dict[str, tuple[Callable[[], Callable[..., int]], str]] = {
    "export": (_export, "export, verify and describe the windowed programs of a checkpoint"),
    "client": (_client, "decode a codec stream on this device with an execution plan (from a file or a server)"),
    "codec-stream": (_codec_stream, "record codes as a codec stream for a plan, or inspect a recording"),
    "rknn-convert": (_rknn_convert, "compile step graphs to fp16 .rknn and check them (the converter venv)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.subparser_init(subparsers).set_defaults(subcommand=subcommand)
    for name, (_main, help_text) in OWN_PARSERS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)  # its arguments go to its own parser
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_PARSERS:
        own_main = OWN_PARSERS[argv[0]][0]()
        return own_main(argv[1:], prog=f"{PROG} {argv[0]}")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        return args.subcommand.cmd(args)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
