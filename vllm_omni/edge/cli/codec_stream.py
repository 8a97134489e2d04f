"""``vllm-omni-edge codec-stream record|inspect`` (``python -m vllm_omni.edge codec-stream ...``).

``record`` turns codes (``.npy``, int ``[T, Q]``) into a recorded stream for a plan; ``inspect``
prints one line per message of a recording. Exit codes: 0 done, 1 unreadable or invalid input
(codes that are not integers in range, a bad plan or recording), 2 bad arguments (a size below 1
or over the stream's limit, ``--out`` naming an input, an existing file that is not a recording
without ``--force``, a path under a file or in a read-only directory). ``--out`` is written
atomically, its directory made if need be: a failure leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..errors import EdgeError
from ..files import directory_problem, write_atomically
from ..plan.model import PLAN_NAME, ExecPlan
from ..stream import PACKINGS, RECORDING_MAGIC, FrameBatch, StreamStart, encode_recording, iter_events, message_batches
from .types import positive_int, same_file


def main(argv: list[str] | None = None, prog: str = "vllm-omni-edge codec-stream") -> int:
    parser = argparse.ArgumentParser(prog=prog)
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="codes (.npy, int [T, Q]) -> a recorded stream for a plan")
    rec.add_argument("--codes", type=Path, required=True)
    rec.add_argument("--plan", type=Path, required=True, help="plan directory: the stream names its id and geometry")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--frames-per-message", type=positive_int, default=4)
    rec.add_argument("--packing", choices=PACKINGS, default="packed11")
    rec.add_argument("--force", action="store_true", help="replace an existing --out that is not a recording")
    show = commands.add_parser("inspect", help="one line per message of a recording")
    show.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        problem = _check_record_arguments(args)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        if args.command == "record":
            plan = ExecPlan.load(args.plan, check_sha256=False)
            codes = np.load(args.codes, allow_pickle=False)
            start = StreamStart.for_plan(plan, packing=args.packing)
            size = args.frames_per_message
            if size > start.max_frames_per_message:
                print(
                    f"error: --frames-per-message {size}: a message holds at most {start.max_frames_per_message} "
                    "frames",
                    file=sys.stderr,
                )
                return 2
            if codes.ndim != 2:
                raise EdgeError(f"{args.codes}: codes must be [T, Q] (frame-major), found shape {list(codes.shape)}")
            batches = [(piece, {}) for piece in message_batches(codes, size)]
            if batches:
                batches[-1] = (batches[-1][0], {"end_of_stream": True})
            data = encode_recording(start, batches)
            args.out.parent.mkdir(parents=True, exist_ok=True)
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
    except (EdgeError, OSError, ValueError, EOFError) as exc:  # np.load: ValueError / EOFError on a bad file
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _check_record_arguments(args: argparse.Namespace) -> str | None:
    """Why ``record`` must not write ``--out`` (checked before anything is read), or ``None``."""
    out = args.out
    inputs = [args.codes, args.plan, args.plan / PLAN_NAME if args.plan.is_dir() else args.plan]
    if any(same_file(out, source) for source in inputs):
        return f"--out {out} is an input of this run; it would be overwritten"
    if out.is_dir():
        return f"--out {out} is a directory; name a file"
    problem = directory_problem(out.parent)
    if problem:
        return f"--out {out} cannot be written: {problem}"
    if out.exists() and not args.force:
        try:
            with open(out, "rb") as handle:
                recorded = handle.read(len(RECORDING_MAGIC)) == RECORDING_MAGIC
        except OSError:
            recorded = False
        if not recorded:
            return f"--out {out} exists and is not a codec-stream recording; pass --force to replace it"
    return None
