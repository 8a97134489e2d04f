"""Writing one stream's messages in order (the server side, and recordings)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from .errors import InvalidFramesError
from .messages import (
    FLAG_END_OF_STREAM,
    FLAG_RESET,
    FLAG_SEGMENT_END,
    HEADER,
    PROTOCOL_VERSION,
    StreamDone,
    StreamStart,
)
from .packing import pack11


def message_batches(frames: np.ndarray, per_message: int) -> Iterator[np.ndarray]:
    """``frames [T, Q]`` in consecutive pieces of at most ``per_message`` frames, one per frames message."""
    if per_message < 1:
        raise InvalidFramesError(f"frames per message must be at least 1, found {per_message}")
    for first in range(0, len(frames), per_message):
        yield frames[first : first + per_message]


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
            raise InvalidFramesError(f"frames must be [T, {contract.num_quantizers}], found {list(frames.shape)}")
        if np.issubdtype(frames.dtype, np.floating):  # whole-number floats convert exactly; 2020.7 is no code
            fractional = ~np.isfinite(frames) | (frames != np.floor(frames))
            if fractional.any():
                raise InvalidFramesError(
                    f"codes must be whole numbers, found {float(frames[fractional].flat[0])} (dtype {frames.dtype}): "
                    "codec ids are integers and are never rounded or truncated"
                )
            frames = frames.astype(np.int64)
        elif not np.issubdtype(frames.dtype, np.integer):
            raise InvalidFramesError(f"codes must be integers, found dtype {frames.dtype}")
        count = frames.shape[0]
        flags = (
            (FLAG_END_OF_STREAM if end_of_stream else 0)
            | (FLAG_SEGMENT_END if segment_end else 0)
            | (FLAG_RESET if reset else 0)
        )
        if count > contract.max_frames_per_message or (count == 0 and not flags):
            raise InvalidFramesError(f"a message holds 1..{contract.max_frames_per_message} frames, found {count}")
        if count and (frames.min() < 0 or frames.max() >= contract.codebook_size):
            bad = np.argwhere((frames < 0) | (frames >= contract.codebook_size))[0].tolist()
            raise InvalidFramesError(
                f"codes must be in 0..{contract.codebook_size - 1}, found {int(frames[tuple(bad)])} at "
                f"[frame, codebook] = {bad} of this message (stream frame {self.frames_sent + bad[0]})"
            )
        header = HEADER.pack(PROTOCOL_VERSION, flags, count, self.seq, self.frames_sent)
        body = frames.astype("<i2").tobytes() if contract.packing == "int16" else pack11(frames)
        self.seq += 1
        self.frames_sent += count
        return header + body

    def marker(self, *, end_of_stream=False, segment_end=False, reset=False) -> bytes:
        """A frames message with no frames, only its flags (a segment's end, the stream's end, a reset)."""
        empty = np.zeros((0, self.contract.num_quantizers), dtype=np.int64)
        return self.frames(empty, end_of_stream=end_of_stream, segment_end=segment_end, reset=reset)

    def finish(self) -> tuple[bytes, bytes]:
        """The stream's last two messages after its frames: end of stream (binary), then done (text)."""
        return self.marker(end_of_stream=True), self.done()

    def done(self, reason: str = "complete", error: str | None = None) -> bytes:
        last = self.seq - 1 if self.seq else None
        payload = StreamDone(self.frames_sent, last, reason, error).to_json()
        return json.dumps(payload, separators=(",", ":")).encode()
