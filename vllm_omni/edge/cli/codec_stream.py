"""``python -m vllm_omni.edge.codec_stream record|inspect`` (script ``vllm-omni-edge-codec-stream``).

``record`` turns codes (``.npy``, int ``[T, Q]``) into a recorded stream for a plan; ``inspect``
prints one line per message of a recording.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..errors import EdgeError
from ..files import write_atomically
from ..plan.model import ExecPlan
from ..stream import PACKINGS, FrameBatch, StreamStart, encode_recording, iter_events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni.edge.codec_stream")
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="codes (.npy, int [T, Q]) -> a recorded stream for a plan")
    rec.add_argument("--codes", type=Path, required=True)
    rec.add_argument("--plan", type=Path, required=True, help="plan directory: the stream names its id and geometry")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--frames-per-message", type=int, default=4)
    rec.add_argument("--packing", choices=PACKINGS, default="packed11")
    show = commands.add_parser("inspect", help="one line per message of a recording")
    show.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "record":
            plan = ExecPlan.load(args.plan, check_sha256=False)
            codes = np.load(args.codes)
            start = StreamStart.for_plan(plan, packing=args.packing)
            size = args.frames_per_message
            batches = [(codes[i : i + size], {}) for i in range(0, len(codes), size)]
            if batches:
                batches[-1] = (batches[-1][0], {"end_of_stream": True})
            data = encode_recording(start, batches)
            write_atomically(args.out, lambda temporary: temporary.write_bytes(data))
            print(f"{args.out}: {len(codes)} frames in {len(batches)} messages, {len(data)} bytes")
            return 0
        with open(args.path, "rb") as stream:
            for event in iter_events(stream):
                if isinstance(event, FrameBatch):
                    flags = [n for n, f in (("end", 1), ("segment-end", 2), ("reset", 4)) if event.flags & f]
                    print(f"frames seq={event.seq} first={event.first_frame} count={len(event.frames)} {flags}")
                else:
                    print(json.dumps(event.to_json())[:200])
        return 0
    except (EdgeError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
