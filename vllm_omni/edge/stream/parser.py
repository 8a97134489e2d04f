"""Reading messages: every length, version, flag, sequence number and code checked against the stream so far."""

from __future__ import annotations

import json

import numpy as np

from . import errors
from .messages import (
    DONE_REASONS,
    FLAG_END_OF_STREAM,
    HEADER,
    KIND_BINARY,
    KIND_JSON,
    KNOWN_FLAGS,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    FrameBatch,
    StreamDone,
    StreamStart,
    message_field,
)
from .packing import unpack11


class CodecStreamParser:
    """Turns messages into events, checking each against the protocol and the stream so far.

    A message that raises leaves the parser's state as it was, so a caller may skip a
    :class:`errors.DuplicateMessageError` and go on; other errors end the stream.
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
        raise errors.MalformedMessageError(
            f"message kind {kind!r}; expected {KIND_JSON!r} (JSON) or {KIND_BINARY!r} (frames)"
        )

    def parse_json(self, payload: bytes | str) -> StreamStart | StreamDone:
        if len(payload) > self.max_message_bytes:
            raise errors.OversizedMessageError(
                f"a JSON message of {len(payload)} bytes; the limit is {self.max_message_bytes}"
            )
        try:
            row = json.loads(payload)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise errors.MalformedMessageError(f"a JSON message that does not parse ({type(exc).__name__})") from exc
        if not isinstance(row, dict) or row.get("type") not in ("start", "done"):
            found = row.get("type") if isinstance(row, dict) else type(row).__name__
            raise errors.MalformedMessageError(f"a JSON message of type {found!r}; expected 'start' or 'done'")
        if row["type"] == "start":
            if self.start is not None:
                raise errors.MalformedMessageError("a second start message in one stream")
            self.start = StreamStart.from_json(row)
            return self.start
        if self.start is None:
            raise errors.MalformedMessageError("a done message before the start message")
        if self.done is not None:
            raise errors.FramesAfterEndError("a second done message")
        reason = message_field(row, "reason", str)
        if reason not in DONE_REASONS:
            raise errors.MalformedMessageError(f"done: reason {reason!r}; known: {', '.join(DONE_REASONS)}")
        done = StreamDone(
            total_frames=message_field(row, "total_frames", int),
            last_seq=message_field(row, "last_seq", int, optional=True),
            reason=reason,
            error=message_field(row, "error", str, optional=True),
        )
        if reason == "complete" and done.total_frames != self.frames_received:
            raise errors.SequenceGapError(
                f"done says {done.total_frames} frames, {self.frames_received} arrived; frames were lost"
            )
        self.done = done
        return done

    def parse_frames(self, payload: bytes) -> FrameBatch:
        start = self.start
        if start is None:
            raise errors.MalformedMessageError("a frames message before the start message")
        if len(payload) < HEADER.size:
            raise errors.TruncatedMessageError(
                f"a frames message of {len(payload)} bytes; the header alone is {HEADER.size}"
            )
        version, flags, count, seq, first_frame = HEADER.unpack_from(payload)
        if version != PROTOCOL_VERSION:
            raise errors.BadVersionError(
                f"frames message {seq}: version {version}; this client speaks {PROTOCOL_VERSION}"
            )
        if flags & ~KNOWN_FLAGS:
            raise errors.MalformedMessageError(f"frames message {seq}: unknown flag bits 0x{flags & ~KNOWN_FLAGS:02x}")
        if count > start.max_frames_per_message:
            raise errors.TooManyFramesError(
                f"frames message {seq}: {count} frames; the stream allows {start.max_frames_per_message} per message"
            )
        if count == 0 and not flags:
            raise errors.MalformedMessageError(f"frames message {seq}: no frames and no flag")
        expected = HEADER.size + start.payload_bytes(count)
        if len(payload) < expected:
            raise errors.TruncatedMessageError(
                f"frames message {seq}: {len(payload)} bytes, {count} frames need {expected}"
            )
        if len(payload) > expected:
            raise errors.OversizedMessageError(
                f"frames message {seq}: {len(payload)} bytes, {count} frames need {expected}"
            )
        if seq < self.next_seq:
            raise errors.DuplicateMessageError(f"frames message {seq} again (expected {self.next_seq}); ignored")
        if self.ended or self.done is not None:
            raise errors.FramesAfterEndError(f"frames message {seq} after the end of the stream")
        if seq > self.next_seq:
            raise errors.SequenceGapError(f"frames message {seq} arrived, expected {self.next_seq}: messages were lost")
        if first_frame != self.frames_received:
            raise errors.SequenceGapError(
                f"frames message {seq} starts at frame {first_frame}, {self.frames_received} frames arrived before it"
            )
        body = payload[HEADER.size :]
        if start.packing == "int16":
            codes = np.frombuffer(body, dtype="<i2").astype(np.int64)
        else:
            codes = unpack11(body, count * start.num_quantizers)
        if codes.size and (codes.min() < 0 or codes.max() >= start.codebook_size):
            bad = int(codes[(codes < 0) | (codes >= start.codebook_size)][0])
            raise errors.CodesOutOfRangeError(
                f"frames message {seq}: code {bad} is outside 0..{start.codebook_size - 1}; the stream is corrupt"
            )
        self.next_seq += 1
        self.frames_received += count
        self.ended = bool(flags & FLAG_END_OF_STREAM)
        return FrameBatch(seq, first_frame, codes.reshape(count, start.num_quantizers), flags)
