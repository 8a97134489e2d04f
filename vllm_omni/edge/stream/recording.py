"""Messages on a byte stream (a recorded file, an HTTP body): kind byte, u32 length, payload; recordings."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from .encoder import CodecStreamEncoder
from .errors import MalformedMessageError, OversizedMessageError, TruncatedStreamError
from .messages import (
    KIND_BINARY,
    KIND_JSON,
    MAX_MESSAGE_BYTES,
    RECORD_HEADER,
    RECORDING_MAGIC,
    FrameBatch,
    StreamDone,
    StreamStart,
)
from .parser import CodecStreamParser


def record(kind: bytes, payload: bytes) -> bytes:
    """One message framed for a byte stream: kind, u32 length, payload."""
    return RECORD_HEADER.pack(kind, len(payload)) + payload


def read_records(
    stream: BinaryIO, max_bytes: int = MAX_MESSAGE_BYTES, magic: bool = True
) -> Iterator[tuple[bytes, bytes]]:
    """``(kind, payload)`` per framed message until a clean end; a cut-off message is :class:`TruncatedStreamError`.

    A length over ``max_bytes`` is refused before reading (no allocation from a hostile length).
    """
    if magic:
        head = _read_exactly(stream, len(RECORDING_MAGIC))
        if head != RECORDING_MAGIC:
            raise MalformedMessageError(
                f"not a codec-stream recording: it starts with {head!r}, expected {RECORDING_MAGIC!r}"
            )
    while True:
        header = _read_exactly(stream, RECORD_HEADER.size, allow_empty=True)
        if not header:
            return
        kind, length = RECORD_HEADER.unpack(header)
        if kind not in (KIND_JSON, KIND_BINARY):
            raise MalformedMessageError(f"a framed message of kind {kind!r}; expected {KIND_JSON!r} or {KIND_BINARY!r}")
        if length > max_bytes:
            raise OversizedMessageError(f"a framed message of {length} bytes; the limit is {max_bytes}")
        yield kind, _read_exactly(stream, length)


def _read_exactly(stream: BinaryIO, size: int, allow_empty: bool = False) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            got = size - remaining
            if got == 0 and allow_empty:
                return b""
            raise TruncatedStreamError(f"the stream ended {got} bytes into a {size}-byte read: it was cut off")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def iter_events(
    stream: BinaryIO, parser: CodecStreamParser | None = None
) -> Iterator[StreamStart | FrameBatch | StreamDone]:
    """Parse a framed byte stream; duplicates raise like every other error (the caller decides)."""
    parser = parser or CodecStreamParser()
    for kind, payload in read_records(stream, parser.max_message_bytes):
        yield parser.parse(kind, payload)
        if parser.done is not None:
            return
    raise TruncatedStreamError(
        f"the stream ended after {parser.frames_received} frames without a done message: it was cut off"
    )


def encode_recording(
    start: StreamStart, batches: list[tuple[np.ndarray, dict[str, bool]]], done: dict | None = None
) -> bytes:
    """A whole recording: start, one frames message per ``(frames, flags)`` and done."""
    encoder = CodecStreamEncoder(start)
    out = io.BytesIO()
    out.write(RECORDING_MAGIC)
    out.write(record(KIND_JSON, encoder.start()))
    for frames, flags in batches:
        out.write(record(KIND_BINARY, encoder.frames(frames, **flags)))
    out.write(record(KIND_JSON, encoder.done(**(done or {}))))
    return out.getvalue()
