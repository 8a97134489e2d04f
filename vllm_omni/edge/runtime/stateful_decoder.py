"""Drive stateful step graphs over a stream: own the cache and position, schedule first/main steps.

The decoder is backend-agnostic: a :class:`~..backends.interface.StepRunner` is anything with a
``contract`` and a ``run(codes, freqs, cache_valid, cache) -> (audio, cache)`` method (onnxruntime,
rknn on a board, the ExecuTorch runtime on phones, torch in tests). Frames arrive in any amounts;
audio leaves as soon as a whole step's worth of frames is there. ``flush()`` ends a stream: it
decodes what is left by padding the last step with code 0. The decoder is causal, so the padding
cannot change the audio of real frames, and the padding's own audio is cut off before it is returned.
"""

from __future__ import annotations

import numpy as np

from ..backends.interface import StepRunner
from ..graphs.step_contract import StepContractError
from .frames import check_frames


def rope_angles(start: int, count: int, inv_freq: np.ndarray) -> np.ndarray:
    """``float32[count, D/2]``: angles of positions ``start .. start+count-1``, reduced mod 2*pi.

    The product is formed in float32 exactly as the full decode forms it, then reduced in float64,
    so the in-graph cos/sin equal the full decode's to float32 rounding at any position.
    """
    positions = np.arange(start, start + count, dtype=np.float32)
    angles = positions[:, None] * inv_freq[None, :]
    return np.mod(angles.astype(np.float64), 2 * np.pi).astype(np.float32)


class StatefulDecoder:
    """Exact streaming decode of one stream. ``feed(frames)`` -> PCM, ``flush()`` at the end, ``reset()``.

    ``frames`` are frame-major integer codes ``[T, num_quantizers]`` (the codec stream's order).
    Returned PCM is ``float32[samples]`` at ``sample_rate``.
    """

    def __init__(self, main: StepRunner, first: StepRunner | None = None):
        self.main, self.first = main, first
        contract = main.contract
        if first is not None and not first.contract.shares_cache_with(contract):
            raise StepContractError(
                f"first step (B={first.contract.step_frames}, N={first.contract.cache_numel}) and main step "
                f"(B={contract.step_frames}, N={contract.cache_numel}) do not share a cache layout; export both "
                "from the same checkpoint"
            )
        self.contract = contract
        self.codec = contract.codec
        self._inv_freq = np.asarray(contract.rope_inv_freq, dtype=np.float32)
        self.reset()

    # -- stream state ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the stream: zero cache, position 0, no pending frames."""
        self._cache = np.zeros(self.contract.cache_numel, dtype=np.float32)
        self._position = 0
        self._pending = np.zeros((0, self.contract.num_quantizers), dtype=np.int64)

    @property
    def position(self) -> int:
        """Frames decoded so far in this stream."""
        return self._position

    @property
    def pending_frames(self) -> int:
        return len(self._pending)

    def check_frames(self, frames: np.ndarray) -> np.ndarray:
        """Return ``frames`` as int64 ``[T, Q]`` or raise :class:`InvalidFramesError` (nothing is changed)."""
        return check_frames(frames, self.contract.num_quantizers, self.contract.codebook_size, self._position)

    # -- decoding ------------------------------------------------------------------------------------

    def feed(self, frames: np.ndarray) -> np.ndarray:
        """Queue ``frames`` and decode every whole step now possible; returns the new PCM (maybe empty)."""
        frames = self.check_frames(frames)
        self._pending = np.concatenate([self._pending, frames])
        pieces = []
        while True:
            runner = self._next_runner()
            size = runner.contract.step_frames
            if len(self._pending) < size:
                break
            pieces.append(self._step(runner, self._pending[:size]))
            self._pending = self._pending[size:]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def drain(self) -> np.ndarray:
        """Decode now every pending frame that whole steps of the plan's sizes take exactly (largest first), and
        keep the stream going: for frames that come slower than real time (a talker waiting for text), whose
        audio would otherwise wait for a full main step. Exact like :meth:`feed` (the cache does not depend on
        the step size); fewer frames than the smallest step stay pending. Returns the new PCM (maybe empty)."""
        runners = sorted((r for r in (self.first, self.main) if r is not None), key=lambda r: -r.contract.step_frames)
        pieces = []
        while fitting := [r for r in runners if r.contract.step_frames <= len(self._pending)]:
            size = fitting[0].contract.step_frames
            pieces.append(self._step(fitting[0], self._pending[:size]))
            self._pending = self._pending[size:]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def flush(self) -> np.ndarray:
        """End the stream: decode the frames still pending, return their PCM, and reset.

        The last step may be padded, which leaves made-up frames in the cache, so the stream
        cannot continue after a flush: the decoder starts a new one.
        """
        pieces = []
        while len(self._pending):
            runners = [r for r in (self.first, self.main) if r is not None]
            fitting = [r for r in runners if r.contract.step_frames >= len(self._pending)]
            runner = min(fitting, key=lambda r: r.contract.step_frames) if fitting else self._next_runner()
            real = min(len(self._pending), runner.contract.step_frames)
            block = np.zeros((runner.contract.step_frames, self.contract.num_quantizers), dtype=np.int64)
            block[:real] = self._pending[:real]
            pieces.append(self._step(runner, block, real_frames=real))
            self._pending = self._pending[real:]
        self.reset()
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def _next_runner(self) -> StepRunner:
        return self.first if (self.first is not None and self._position == 0) else self.main

    def _step(self, runner: StepRunner, frames: np.ndarray, real_frames: int | None = None) -> np.ndarray:
        size = runner.contract.step_frames
        real = size if real_frames is None else real_frames
        codes = np.ascontiguousarray(frames.T[None], dtype=runner.contract.codes_dtype)
        freqs = rope_angles(self._position, size, self._inv_freq)
        valid = np.array([min(self._position, self.contract.kv_slots)], dtype=np.float32)
        audio, cache = runner.run(codes, freqs, valid, self._cache)
        self._cache = cache
        self._position += real
        return np.asarray(audio, dtype=np.float32)[: real * self.codec.samples_per_frame]
