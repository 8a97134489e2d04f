"""Codec-stream recordings for tests and benchmarks: segments of frames as the server would send them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..stream import (
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
