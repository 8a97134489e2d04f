#!/usr/bin/env python3
"""Prepare the Qwen3-TTS vocoder (Code2Wav) stateful step graph for a Rockchip NPU (run it in the converter venv).

The command Rockchip users know, kept as a thin entry: it calls ``vllm_omni.edge.cli.rknn_convert`` with the same
flags and the same exit codes (0 done, 1 a failed stage, 2 bad arguments, 4 below the simulator bar, 5 register
overflow, 6 ops off the NPU beyond the allow-list). Set up the venv with ``make setup-rknn``, then for example::

    .venv-rknn/bin/python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --onnx step_b16.onnx --target rk3588 \\
        --output out/rk3588/step_b16.rknn

See docs/hardware/rockchip-npu.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROG = "python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py"


def run(argv: list[str] | None = None) -> int:
    try:
        from vllm_omni.edge.cli.rknn_convert import main
    except ModuleNotFoundError as exc:
        if exc.name != "vllm_omni":
            print(f"error: {exc}; run this in the converter venv: make setup-rknn, then .venv-rknn/bin/python {PROG}",
                  file=sys.stderr)  # fmt: skip
            return 1
        # A checkout whose venv lacks the editable install: the package sits two folders up.
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        return run(argv)
    return main(argv, prog=PROG)


if __name__ == "__main__":
    raise SystemExit(run())
