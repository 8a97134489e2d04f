"""``python -m vllm_omni.edge`` (script ``vllm-omni-edge``): one command per job, one module per subcommand.

    python -m vllm_omni.edge build --hardware CLASS --model DIR_OR_ID --out DIR [--target rk3588]
    python -m vllm_omni.edge plan validate DIR
    python -m vllm_omni.edge plan show DIR
    python -m vllm_omni.edge hardware list
    python -m vllm_omni.edge hardware detect

``build`` makes every artifact of the class, verifies each in its runtime, and writes
``DIR/exec_plan.json``; a re-run keeps artifacts that are already built and intact. Exit codes:
0 success, 1 a failed build or an invalid plan (one ``error:`` line says which artifact and
field), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import EdgeError
from .build import BuildSubcommand
from .hardware import HardwareSubcommand
from .plan import PlanSubcommand
from .types import CLISubcommand

SUBCOMMANDS: tuple[CLISubcommand, ...] = (BuildSubcommand(), PlanSubcommand(), HardwareSubcommand())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni.edge", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.subparser_init(subparsers).set_defaults(subcommand=subcommand)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        return args.subcommand.cmd(args)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
