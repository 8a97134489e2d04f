"""Codec-stream recordings for tests and benchmarks: segments of frames as the server would send them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from vllm_omni.edge.stream import (
    KIND_BINARY,
    KIND_JSON,
    RECORDING_MAGIC,
    CodecStreamEncoder,
    StreamStart,
    message_batches,
    record,
)


def segment_messages(
    plan: Any, segments: list[np.ndarray], per_message: int = 3, **start: Any
) -> list[tuple[bytes, bytes]]:
    """``(kind, payload)`` of one stream for ``plan`` (an ``ExecPlan``), ``per_message`` frames per message.

    Each segment after the first starts with ``reset``; each ends with ``segment end``, the last
    with ``end of stream``. A test may drop, repeat or damage messages before :func:`recording`.
    """
    encoder = CodecStreamEncoder(StreamStart.for_plan(plan, **start))
    out = [(KIND_JSON, encoder.start())]
    for index, frames in enumerate(segments):
        pieces = list(message_batches(frames, per_message))
        for number, piece in enumerate(pieces):
            last = number == len(pieces) - 1
            flags = {
                "reset": index > 0 and number == 0,
                "segment_end": last and index < len(segments) - 1,
                "end_of_stream": last and index == len(segments) - 1,
            }
            out.append((KIND_BINARY, encoder.frames(piece, **flags)))
    out.append((KIND_JSON, encoder.done()))
    return out


def recording(items: list[tuple[bytes, bytes]]) -> bytes:
    """``items`` as a recorded byte stream (magic, then each message framed)."""
    return RECORDING_MAGIC + b"".join(record(kind, payload) for kind, payload in items)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with 1-4 random edits (a byte changed, a cut, random bytes inserted, bytes deleted, a piece
    repeated): what the parsers' fuzzers feed them."""
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        action = rng.randrange(5)
        position = rng.randrange(len(buffer) + 1)
        if action == 0 and buffer:
            buffer[min(position, len(buffer) - 1)] = rng.randrange(256)
        elif action == 1:
            buffer = buffer[:position]
        elif action == 2:
            buffer[position:position] = rng.randbytes(rng.randint(1, 16))
        elif action == 3 and buffer:
            del buffer[position : position + rng.randint(1, 8)]
        else:
            start = rng.randrange(len(buffer) + 1)
            buffer[position:position] = buffer[start : start + rng.randint(1, 24)]
    return bytes(buffer)
