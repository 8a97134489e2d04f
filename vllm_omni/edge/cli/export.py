"""Export the windowed programs of a Qwen3-TTS checkpoint's Code2Wav decoder (``vllm-omni-edge export``).

One fixed-shape program per window of the ramp, verified, plus ``manifest.json``
(:func:`vllm_omni.edge.builders.windowed.export_windowed_programs`)::

    python -m vllm_omni.edge.decoder_export --model DIR_OR_HUB_ID --ramp 2 4 8 16 25 --context 72 \
        --backend executorch --partitioner xnnpack --out-dir out/npu_phone
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EdgeError
from .types import add_checkpoint_argument

PROG = "python -m vllm_omni.edge.decoder_export"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from ..backends.executorch.export import PARTITIONERS
    from ..backends.registry import windowed_backend_names

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export, verify and describe the windowed Code2Wav programs of a Qwen3-TTS checkpoint.",
    )
    add_checkpoint_argument(parser, "--model", "checkpoint dir, its speech_tokenizer/ dir, or a hub id")
    parser.add_argument("--ramp", type=int, nargs="+", default=[2, 4, 8, 16, 25], help="chunk sizes in frames")
    parser.add_argument("--context", type=int, default=72, help="frames of decoded history in front of each chunk")
    parser.add_argument("--backend", default="executorch", help=f"one of {', '.join(windowed_backend_names())}")
    parser.add_argument(
        "--partitioner", default=None, help=f"executorch delegate: {', '.join(PARTITIONERS)} (default xnnpack)"
    )
    parser.add_argument("--dtype", default="fp32", help="weights and activations (fp32)")
    parser.add_argument("--out-dir", required=True, type=Path, help="where the programs and manifest.json go")
    parser.add_argument(
        "--one-program",
        action="store_true",
        help="executorch: one .pte with a method per window, the weights stored once (default: a file per window)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip running each program against eager")
    parser.add_argument("--tolerance", type=float, default=None, help="max abs difference allowed vs eager")
    parser.add_argument("--force", action="store_true", help="replace a manifest.json in --out-dir not written here")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    from ..builders.windowed import WindowedExportRequest, export_summary, export_windowed_programs

    args = build_parser(prog).parse_args(argv)
    if not args.model:
        print("error: no model: pass --model DIR_OR_HUB_ID or set QWEN3_TTS_MODEL", file=sys.stderr)
        return 2
    request = WindowedExportRequest(
        model=args.model,
        out_dir=args.out_dir,
        ramp=tuple(args.ramp),
        context_frames=args.context,
        backend=args.backend,
        partitioner=args.partitioner,
        dtype=args.dtype,
        check=not args.no_check,
        one_program=args.one_program,
        tolerance=args.tolerance,
        force=args.force,
    )
    try:
        manifest = export_windowed_programs(request, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(export_summary(manifest))
    return 0
