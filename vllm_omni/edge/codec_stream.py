"""The codec-token stream: codec frames from the server to a device, as versioned messages (numpy only).

Three kinds of message (docs/serving/codec_stream.md has the byte layout and examples):

- **start** (JSON text): protocol name and version, codebooks, codebook size, frame rate, sample
  rate, the packing of the codes, the largest frame count per message, the hardware class and
  the plan's id (or the plan itself);
- **frames** (binary): a 12-byte little-endian header, then the codes frame-major::

      offset 0  u8   version (1)
             1  u8   flags: 0x01 end of stream, 0x02 segment end, 0x04 reset (other bits must be 0)
             2  u16  frame count T (1 .. max_frames_per_message; 0 only with a flag set)
             4  u32  sequence number (0, 1, 2, ... per stream)
             8  u32  index of the message's first frame in the stream
            12  ...  T x Q codes: int16 little-endian, or 11-bit packed (LSB first, zero-padded to a byte)

- **done** (JSON text): total frames, last sequence number, reason (``complete``, ``cancelled``,
  ``error``) and an error text.

Semantics of the flags, which the edge client applies: ``reset`` drops the decoder's state and
any frames not yet decoded *before* this message's frames (a new utterance: no stale audio);
``segment end`` flushes the decoder *after* them (the segment's audio is complete, the next one
starts fresh); ``end of stream`` also flushes, and nothing may follow but ``done``.

On a byte stream (a recorded file, an HTTP body) every message is framed as one kind byte
(``J`` JSON, ``B`` binary), a u32 little-endian length and the payload; a recording starts with
the 4-byte magic ``QCS\\x01``. :class:`CodecStreamParser` takes any bytes and returns a typed
event or raises a typed :class:`CodecStreamError`; every length is checked against a limit
before anything is allocated.
"""

from __future__ import annotations

import io
import json
import math
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import numpy as np

from .errors import EdgeError

PROTOCOL = "qwen3-tts-codec-stream"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<BBHII")
FLAG_END_OF_STREAM = 0x01
FLAG_SEGMENT_END = 0x02
FLAG_RESET = 0x04
KNOWN_FLAGS = FLAG_END_OF_STREAM | FLAG_SEGMENT_END | FLAG_RESET
PACKINGS = ("int16", "packed11")
RECORDING_MAGIC = b"QCS\x01"
KIND_JSON, KIND_BINARY = b"J", b"B"
RECORD_HEADER = struct.Struct("<cI")
MAX_MESSAGE_BYTES = 1 << 20  # a start message may carry a whole plan; frames stay under 12 + 2 * 4096 * 64
MAX_FRAMES_PER_MESSAGE = 4096  # the hard cap a start message may ask for
DONE_REASONS = ("complete", "cancelled", "error")


class CodecStreamError(EdgeError):
    """A message or stream breaks the protocol. Subclasses say how."""


class MalformedMessageError(CodecStreamError):
    """Not JSON, wrong type, missing or mistyped fields, a message out of order."""


class BadVersionError(CodecStreamError):
    """A protocol version this parser does not speak."""


class TruncatedMessageError(CodecStreamError):
    """A message shorter than its header says."""


class OversizedMessageError(CodecStreamError):
    """A message longer than its header says, or than the limits allow."""


class TooManyFramesError(CodecStreamError):
    """A frame count over the stream's ``max_frames_per_message``."""


class CodesOutOfRangeError(CodecStreamError):
    """A code outside ``0 .. codebook_size - 1``."""


class SequenceGapError(CodecStreamError):
    """Messages are missing: the sequence number jumped."""


class DuplicateMessageError(CodecStreamError):
    """A sequence number already seen (a retransmission); the message is ignored."""


class FramesAfterEndError(CodecStreamError):
    """Frames after the end-of-stream flag or the done message."""


class TruncatedStreamError(CodecStreamError):
    """The byte stream ended inside a message, or before the done message."""


# -- messages ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamStart:
    """The stream's contract, sent first as JSON."""

    num_quantizers: int
    codebook_size: int
    frame_rate: float
    sample_rate: int
    packing: str = "packed11"
    max_frames_per_message: int = 256
    hardware_class: str | None = None
    plan_id: str | None = None
    plan: dict[str, Any] | None = None
    stream_id: str | None = None
    version: int = PROTOCOL_VERSION

    def to_json(self) -> dict[str, Any]:
        row = {"type": "start", "protocol": PROTOCOL, **asdict(self)}
        return {key: value for key, value in row.items() if value is not None}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> StreamStart:
        if row.get("protocol") != PROTOCOL:
            raise MalformedMessageError(f"start: protocol {row.get('protocol')!r}, expected {PROTOCOL!r}")
        version = row.get("version")
        if version != PROTOCOL_VERSION:
            raise BadVersionError(f"start: protocol version {version!r}; this client speaks {PROTOCOL_VERSION}")
        start = cls(
            num_quantizers=_field(row, "num_quantizers", int),
            codebook_size=_field(row, "codebook_size", int),
            frame_rate=float(_field(row, "frame_rate", (int, float))),
            sample_rate=_field(row, "sample_rate", int),
            packing=_field(row, "packing", str),
            max_frames_per_message=_field(row, "max_frames_per_message", int),
            hardware_class=_field(row, "hardware_class", str, optional=True),
            plan_id=_field(row, "plan_id", str, optional=True),
            plan=_field(row, "plan", dict, optional=True),
            stream_id=_field(row, "stream_id", str, optional=True),
        )
        start.check()
        return start

    def check(self) -> None:
        if not 1 <= self.num_quantizers <= 64:
            raise MalformedMessageError(f"start: num_quantizers {self.num_quantizers} is outside 1..64")
        if not 2 <= self.codebook_size <= 32768:
            raise MalformedMessageError(f"start: codebook_size {self.codebook_size} is outside 2..32768 (int16 codes)")
        if self.packing not in PACKINGS:
            raise MalformedMessageError(f"start: packing {self.packing!r}; known: {', '.join(PACKINGS)}")
        if self.packing == "packed11" and self.codebook_size > 2048:
            raise MalformedMessageError(f"start: packed11 holds codes < 2048, codebook_size is {self.codebook_size}")
        if not 1 <= self.max_frames_per_message <= MAX_FRAMES_PER_MESSAGE:
            raise MalformedMessageError(
                f"start: max_frames_per_message {self.max_frames_per_message} is outside 1..{MAX_FRAMES_PER_MESSAGE}"
            )
        if not (self.frame_rate > 0 and math.isfinite(self.frame_rate)) or self.sample_rate < 1:
            raise MalformedMessageError(f"start: frame_rate {self.frame_rate} and sample_rate {self.sample_rate}")

    def payload_bytes(self, frame_count: int) -> int:
        codes = frame_count * self.num_quantizers
        return 2 * codes if self.packing == "int16" else (11 * codes + 7) // 8

    @classmethod
    def for_plan(cls, plan: Any, **fields: Any) -> StreamStart:
        """The start message of a stream decoded with ``plan`` (an :class:`~.plan.ExecPlan`): its geometry and id."""
        geometry = {
            "num_quantizers": plan.num_quantizers,
            "codebook_size": plan.codebook_size,
            "frame_rate": plan.sample_rate / plan.samples_per_frame,
            "sample_rate": plan.sample_rate,
            "hardware_class": plan.hardware_class,
            "plan_id": plan.plan_id,
        }
        return cls(**(geometry | fields))


@dataclass(frozen=True)
class FrameBatch:
    """A binary frames message: ``frames`` is ``int64[T, Q]``, frame-major."""

    seq: int
    first_frame: int
    frames: np.ndarray = field(repr=False)
    flags: int = 0

    @property
    def end_of_stream(self) -> bool:
        return bool(self.flags & FLAG_END_OF_STREAM)

    @property
    def segment_end(self) -> bool:
        return bool(self.flags & FLAG_SEGMENT_END)

    @property
    def reset(self) -> bool:
        return bool(self.flags & FLAG_RESET)


@dataclass(frozen=True)
class StreamDone:
    total_frames: int
    last_seq: int | None
    reason: str = "complete"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": "done", **asdict(self)}


# -- code packing -----------------------------------------------------------------------------------

_BITS = np.arange(11, dtype=np.uint16)


def pack11(codes: np.ndarray) -> bytes:
    """Codes (each < 2048) as 11-bit fields, least significant bit first, zero-padded to a whole byte."""
    values = np.asarray(codes, dtype=np.uint16).ravel()
    bits = ((values[:, None] >> _BITS) & 1).astype(np.uint8)
    return np.packbits(bits.ravel(), bitorder="little").tobytes()


def unpack11(data: bytes, count: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little", count=11 * count)
    return (bits.reshape(count, 11).astype(np.int64) << _BITS.astype(np.int64)).sum(axis=1)


# -- encoder ----------------------------------------------------------------------------------------


class CodecStreamEncoder:
    """Messages of one stream in order: ``start()``, ``frames(...)`` any number of times, ``done()``."""

    def __init__(self, start: StreamStart):
        start.check()
        self.contract = start
        self.seq = 0
        self.frames_sent = 0

    def start(self) -> bytes:
        return json.dumps(self.contract.to_json(), separators=(",", ":")).encode()

    def frames(self, frames: np.ndarray, *, end_of_stream=False, segment_end=False, reset=False) -> bytes:
        """One binary message. ``frames``: integer codes ``[T, Q]`` (T may be 0 only with a flag)."""
        frames = np.asarray(frames)
        contract = self.contract
        if frames.ndim != 2 or frames.shape[1] != contract.num_quantizers:
            raise ValueError(f"frames must be [T, {contract.num_quantizers}], found {list(frames.shape)}")
        count = frames.shape[0]
        flags = (
            (FLAG_END_OF_STREAM if end_of_stream else 0)
            | (FLAG_SEGMENT_END if segment_end else 0)
            | (FLAG_RESET if reset else 0)
        )
        if count > contract.max_frames_per_message or (count == 0 and not flags):
            raise ValueError(f"a message holds 1..{contract.max_frames_per_message} frames, found {count}")
        if count and (frames.min() < 0 or frames.max() >= contract.codebook_size):
            raise ValueError(f"codes must be in 0..{contract.codebook_size - 1}")
        header = HEADER.pack(PROTOCOL_VERSION, flags, count, self.seq, self.frames_sent)
        body = frames.astype("<i2").tobytes() if contract.packing == "int16" else pack11(frames)
        self.seq += 1
        self.frames_sent += count
        return header + body

    def done(self, reason: str = "complete", error: str | None = None) -> bytes:
        last = self.seq - 1 if self.seq else None
        payload = StreamDone(self.frames_sent, last, reason, error).to_json()
        return json.dumps(payload, separators=(",", ":")).encode()


# -- parser -----------------------------------------------------------------------------------------


class CodecStreamParser:
    """Turns messages into events, checking each against the protocol and the stream so far.

    A message that raises leaves the parser's state as it was, so a caller may skip a
    :class:`DuplicateMessageError` and go on; other errors end the stream.
    """

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.max_message_bytes = max_message_bytes
        self.start: StreamStart | None = None
        self.next_seq = 0
        self.frames_received = 0
        self.ended = False  # end-of-stream flag seen
        self.done: StreamDone | None = None

    def parse(self, kind: bytes, payload: bytes) -> StreamStart | FrameBatch | StreamDone:
        if kind == KIND_JSON:
            return self.parse_json(payload)
        if kind == KIND_BINARY:
            return self.parse_frames(payload)
        raise MalformedMessageError(f"message kind {kind!r}; expected {KIND_JSON!r} (JSON) or {KIND_BINARY!r} (frames)")

    def parse_json(self, payload: bytes | str) -> StreamStart | StreamDone:
        if len(payload) > self.max_message_bytes:
            raise OversizedMessageError(
                f"a JSON message of {len(payload)} bytes; the limit is {self.max_message_bytes}"
            )
        try:
            row = json.loads(payload)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise MalformedMessageError(f"a JSON message that does not parse ({type(exc).__name__})") from exc
        if not isinstance(row, dict) or row.get("type") not in ("start", "done"):
            found = row.get("type") if isinstance(row, dict) else type(row).__name__
            raise MalformedMessageError(f"a JSON message of type {found!r}; expected 'start' or 'done'")
        if row["type"] == "start":
            if self.start is not None:
                raise MalformedMessageError("a second start message in one stream")
            self.start = StreamStart.from_json(row)
            return self.start
        if self.start is None:
            raise MalformedMessageError("a done message before the start message")
        if self.done is not None:
            raise FramesAfterEndError("a second done message")
        reason = _field(row, "reason", str)
        if reason not in DONE_REASONS:
            raise MalformedMessageError(f"done: reason {reason!r}; known: {', '.join(DONE_REASONS)}")
        done = StreamDone(
            total_frames=_field(row, "total_frames", int),
            last_seq=_field(row, "last_seq", int, optional=True),
            reason=reason,
            error=_field(row, "error", str, optional=True),
        )
        if reason == "complete" and done.total_frames != self.frames_received:
            raise SequenceGapError(
                f"done says {done.total_frames} frames, {self.frames_received} arrived; frames were lost"
            )
        self.done = done
        return done

    def parse_frames(self, payload: bytes) -> FrameBatch:
        start = self.start
        if start is None:
            raise MalformedMessageError("a frames message before the start message")
        if len(payload) < HEADER.size:
            raise TruncatedMessageError(f"a frames message of {len(payload)} bytes; the header alone is {HEADER.size}")
        version, flags, count, seq, first_frame = HEADER.unpack_from(payload)
        if version != PROTOCOL_VERSION:
            raise BadVersionError(f"frames message {seq}: version {version}; this client speaks {PROTOCOL_VERSION}")
        if flags & ~KNOWN_FLAGS:
            raise MalformedMessageError(f"frames message {seq}: unknown flag bits 0x{flags & ~KNOWN_FLAGS:02x}")
        if count > start.max_frames_per_message:
            raise TooManyFramesError(
                f"frames message {seq}: {count} frames; the stream allows {start.max_frames_per_message} per message"
            )
        if count == 0 and not flags:
            raise MalformedMessageError(f"frames message {seq}: no frames and no flag")
        expected = HEADER.size + start.payload_bytes(count)
        if len(payload) < expected:
            raise TruncatedMessageError(f"frames message {seq}: {len(payload)} bytes, {count} frames need {expected}")
        if len(payload) > expected:
            raise OversizedMessageError(f"frames message {seq}: {len(payload)} bytes, {count} frames need {expected}")
        if seq < self.next_seq:
            raise DuplicateMessageError(f"frames message {seq} again (expected {self.next_seq}); ignored")
        if self.ended or self.done is not None:
            raise FramesAfterEndError(f"frames message {seq} after the end of the stream")
        if seq > self.next_seq:
            raise SequenceGapError(f"frames message {seq} arrived, expected {self.next_seq}: messages were lost")
        if first_frame != self.frames_received:
            raise SequenceGapError(
                f"frames message {seq} starts at frame {first_frame}, {self.frames_received} frames arrived before it"
            )
        body = payload[HEADER.size :]
        if start.packing == "int16":
            codes = np.frombuffer(body, dtype="<i2").astype(np.int64)
        else:
            codes = unpack11(body, count * start.num_quantizers)
        if codes.size and (codes.min() < 0 or codes.max() >= start.codebook_size):
            bad = int(codes[(codes < 0) | (codes >= start.codebook_size)][0])
            raise CodesOutOfRangeError(
                f"frames message {seq}: code {bad} is outside 0..{start.codebook_size - 1}; the stream is corrupt"
            )
        self.next_seq += 1
        self.frames_received += count
        self.ended = bool(flags & FLAG_END_OF_STREAM)
        return FrameBatch(seq, first_frame, codes.reshape(count, start.num_quantizers), flags)


# -- byte streams (recordings, HTTP bodies) -------------------------------------------------------


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


def _field(row: dict[str, Any], name: str, kind, optional: bool = False):
    value = row.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise MalformedMessageError(f"{row.get('type', 'message')}: {name} must be {expected}, found {value!r:.40}")
    return value


# -- command line: record codes as a stream, inspect a recording -----------------------------------


def _command_line(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    from pathlib import Path

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
            from .files import write_atomically
            from .plan import ExecPlan

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


if __name__ == "__main__":
    raise SystemExit(_command_line())
