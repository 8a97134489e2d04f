"""The eager full decode in a process of its own (the worker of :func:`benchmarks.harness.full_decode`).

python -m benchmarks.harness --model DIR --codes CODES.npy --audio-out AUDIO.npy
"""

from __future__ import annotations

import argparse

from .baseline import time_full_decode
from .processes import print_result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the eager full decode of frame-major codes, timed; JSON on stdout")
    parser.add_argument("--model", required=True)
    parser.add_argument("--codes", required=True)
    parser.add_argument("--audio-out", required=True)
    args = parser.parse_args(argv)
    return print_result(time_full_decode(args.model, args.codes, args.audio_out))


if __name__ == "__main__":
    raise SystemExit(main())
