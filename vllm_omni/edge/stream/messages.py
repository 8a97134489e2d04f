"""The codec stream's messages and constants: start (JSON), frames (binary header + codes), done (JSON).

The byte layout is in the package docstring (:mod:`vllm_omni.edge.stream`) and docs/serving/codec_stream.md.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .errors import BadVersionError, MalformedMessageError

PROTOCOL = "qwen3-tts-codec-stream"  # also the WebSocket subprotocol that names it (a browser offers it)
SOCKET_PATH = "/v1/audio/speech/stream"  # the server's WebSocket route that carries the stream (text in pieces)
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
    limits: dict[str, Any] | None = None  # a WebSocket session's SessionLimits (to_json), announced to its client
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
            num_quantizers=message_field(row, "num_quantizers", int),
            codebook_size=message_field(row, "codebook_size", int),
            frame_rate=float(message_field(row, "frame_rate", (int, float))),
            sample_rate=message_field(row, "sample_rate", int),
            packing=message_field(row, "packing", str),
            max_frames_per_message=message_field(row, "max_frames_per_message", int),
            hardware_class=message_field(row, "hardware_class", str, optional=True),
            plan_id=message_field(row, "plan_id", str, optional=True),
            plan=message_field(row, "plan", dict, optional=True),
            stream_id=message_field(row, "stream_id", str, optional=True),
            limits=message_field(row, "limits", dict, optional=True),
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
        """The start message of a stream decoded with ``plan`` (an ``ExecPlan``): its codec geometry and id."""
        codec = plan.codec
        geometry = {
            "num_quantizers": codec.num_quantizers,
            "codebook_size": codec.codebook_size,
            "frame_rate": codec.frame_rate,
            "sample_rate": codec.sample_rate,
            "hardware_class": plan.hardware_class,
            "plan_id": plan.plan_id,
        }
        return cls(**(geometry | fields))


@dataclass(frozen=True)
class SessionLimits:
    """What a WebSocket session's server takes from its client, announced in the start message's ``limits``.

    The names are the server's own (``--speech-max-input-chars`` and so on): a client splits its text by them
    instead of assuming the defaults of one server. A client needs the whole announcement: an announcement that
    lacks a field or types one wrong is :class:`MalformedMessageError`; a field it does not know is ignored
    (a later server may announce more).
    """

    max_input_chars: int  # characters of one ``text`` piece (and of the start's ``input``)
    max_body_bytes: int  # UTF-8 bytes of one client message
    socket_max_queued_chars: int  # text sent and not yet spoken (stream mode: the utterance's whole text)
    socket_idle_s: float  # a session with nothing to say and no message from its client closes after this

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> SessionLimits:
        row = {"type": "start: limits", **row}
        limits = cls(
            max_input_chars=message_field(row, "max_input_chars", int),
            max_body_bytes=message_field(row, "max_body_bytes", int),
            socket_max_queued_chars=message_field(row, "socket_max_queued_chars", int),
            socket_idle_s=float(message_field(row, "socket_idle_s", (int, float))),
        )
        if min(limits.max_input_chars, limits.max_body_bytes, limits.socket_max_queued_chars) < 1 or not (
            limits.socket_idle_s > 0 and math.isfinite(limits.socket_idle_s)
        ):
            raise MalformedMessageError(f"start: limits must all be positive, found {limits}")
        return limits


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


def message_field(row: dict[str, Any], name: str, kind, optional: bool = False):
    value = row.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise MalformedMessageError(f"{row.get('type', 'message')}: {name} must be {expected}, found {value!r:.40}")
    return value
