"""Drive windowed programs over a stream: keep the rolling window of codes, pick programs per the ramp.

The counterpart of :class:`~.stateful_decoder.StatefulDecoder` for stateless windowed programs
(see :mod:`..graphs.window_contract`), with the same ``feed`` / ``flush`` / ``reset`` interface. A
:class:`~..backends.interface.WindowRunner` is anything with a ``window`` and ``run(codes) -> audio``:
an ExecuTorch ``.pte`` or a ``.pt2`` (opened by their backends), eager torch in tests.

``flush()`` decodes a last, short chunk by padding it with code 0 at the *end* of the window; the
decoder is causal, so the padding cannot change the real frames' audio, and its own audio is cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..backends.interface import WindowRunner
from ..errors import EdgeError
from ..geometry import CodecGeometry
from ..graphs.window_contract import Window, window_at, window_schedule
from .frames import check_frames


class WindowedDecoder:
    """Streaming decode of one stream with fixed-shape windows. ``feed(frames)`` -> PCM, ``flush()``, ``reset()``.

    ``frames`` are frame-major integer codes ``[T, num_quantizers]``; PCM is ``float32[samples]``.
    Chunks whose window holds the whole stream so far equal the full decode; later ones see only
    ``context`` frames of history.
    """

    def __init__(
        self,
        runners: Mapping[Window, WindowRunner],
        ramp: Sequence[int],
        context_frames: int,
        codec: CodecGeometry,
    ):
        self.schedule = window_schedule(ramp, context_frames)
        missing = [w.name for w in self.schedule if w not in runners]
        if missing:
            raise EdgeError(f"the ramp {list(ramp)} with context {context_frames} needs programs {missing}; none given")
        self.runners = dict(runners)
        self.context_frames = context_frames
        self.codec = codec
        self.reset()

    def reset(self) -> None:
        """Forget the stream: no history, no pending frames, back to the start of the ramp."""
        self._history = np.zeros((0, self.codec.num_quantizers), dtype=np.int64)
        self._pending = np.zeros((0, self.codec.num_quantizers), dtype=np.int64)
        self._chunk_index = 0
        self._position = 0

    @property
    def position(self) -> int:
        """Frames decoded so far in this stream."""
        return self._position

    @property
    def pending_frames(self) -> int:
        return len(self._pending)

    @property
    def next_window(self) -> Window:
        return window_at(self.schedule, self._chunk_index)

    def feed(self, frames: np.ndarray) -> np.ndarray:
        """Queue ``frames`` and decode every whole chunk now possible; returns the new PCM (maybe empty)."""
        frames = check_frames(
            frames, self.codec.num_quantizers, self.codec.codebook_size, self._position + len(self._pending)
        )
        self._pending = np.concatenate([self._pending, frames])
        pieces = []
        while len(self._pending) >= self.next_window.chunk_frames:
            size = self.next_window.chunk_frames
            pieces.append(self._decode_chunk(self._pending[:size], size))
            self._pending = self._pending[size:]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def flush(self) -> np.ndarray:
        """End the stream: decode the frames still pending (padded at the end), return their PCM, and reset."""
        audio = np.zeros(0, dtype=np.float32)
        if len(self._pending):
            real = len(self._pending)
            chunk = np.zeros((self.next_window.chunk_frames, self.codec.num_quantizers), dtype=np.int64)
            chunk[:real] = self._pending
            audio = self._decode_chunk(chunk, real)
        self.reset()
        return audio

    def _decode_chunk(self, chunk: np.ndarray, real_frames: int) -> np.ndarray:
        window = self.next_window
        if len(self._history) != window.context_frames:  # the schedule guarantees it; a bug otherwise
            raise EdgeError(
                f"window {window.name} needs {window.context_frames} frames of history, have {len(self._history)}"
            )
        frames = np.concatenate([self._history, chunk])
        audio = np.asarray(self.runners[window].run(np.ascontiguousarray(frames.T[None])), dtype=np.float32).ravel()
        expected = window.chunk_frames * self.codec.samples_per_frame
        if audio.shape != (expected,):
            raise EdgeError(f"program {window.name} returned {audio.size} samples, expected {expected}")
        real = frames[: window.context_frames + real_frames]
        self._history = real[max(0, len(real) - self.context_frames) :]
        self._position += real_frames
        self._chunk_index += 1
        return audio[: real_frames * self.codec.samples_per_frame]
