"""Prepare the Qwen3-TTS vocoder (Code2Wav) stateful step graph for a Rockchip NPU.

    python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --model-dir CKPT --codes-length 16 \
        --skip-rknn --output out/step_b16.onnx              # ONNX step graph, self-checked
    python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --model-dir CKPT --codes-length 16 \
        --check-only --output out/step_b16.onnx             # re-run the self-check of an existing graph

``--model-dir`` defaults to $QWEN3_TTS_MODEL. The ONNX half runs in the main venv; compiling to
``.rknn`` (the half without ``--skip-rknn``) runs in the converter venv and is not available in
this version of the script: it stops with a clear message instead of pretending.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir",
        default=os.environ.get("QWEN3_TTS_MODEL"),
        help="checkpoint dir or hub id (default: $QWEN3_TTS_MODEL)",
    )
    parser.add_argument("--codes-length", type=int, default=16, help="frames per step (B)")
    parser.add_argument("--first-codes-length", type=int, help="also export a small first-step graph of B1 frames")
    parser.add_argument("--target", choices=TARGETS, default="rk3588")
    parser.add_argument("--output", type=Path, required=True, help=".onnx (or .rknn: the ONNX goes beside it)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--skip-rknn", action="store_true", help="stop after the ONNX step graph")
    parser.add_argument("--check-only", action="store_true", help="only run the self-check of an existing graph")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    from vllm_omni.edge.errors import EdgeError

    try:
        return run(args)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    from vllm_omni.edge.backends.onnx import check_step_graph, export_step_onnx, graph_contract
    from vllm_omni.edge.decoder_export import load_code2wav_decoder

    if not args.model_dir:
        print("error: no checkpoint: pass --model-dir DIR_OR_HUB_ID or set QWEN3_TTS_MODEL", file=sys.stderr)
        return 2
    if args.codes_length < 1 or (args.first_codes_length is not None and args.first_codes_length < 1):
        print("error: --codes-length and --first-codes-length must be >= 1", file=sys.stderr)
        return 2
    onnx_path = args.output if args.output.suffix == ".onnx" else args.output.with_suffix(".onnx")
    decoder = load_code2wav_decoder(args.model_dir)
    sizes = [args.codes_length] + ([args.first_codes_length] if args.first_codes_length else [])
    for size in sizes:
        path = onnx_path if size == args.codes_length else onnx_path.with_name(f"{onnx_path.stem}_first_b{size}.onnx")
        if args.check_only:
            snr = check_step_graph(decoder, path)
            print(f"{path}: onnxruntime stepwise vs full decode {snr:.1f} dB")
        else:
            export_step_onnx(decoder, size, path, opset=args.opset)
            contract = graph_contract(path)
            print(
                f"{path}: B={contract.step_frames} N={contract.cache_numel} head_dim={contract.head_dim} "
                f"({path.stat().st_size / 1e6:.1f} MB)"
            )
    if not (args.skip_rknn or args.check_only):
        print(
            "error: compiling to .rknn needs the converter venv (.venv-rknn) and tools/rknn/rknn_build.py, which "
            "this version does not ship yet; rerun with --skip-rknn to stop at the ONNX step graph",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
