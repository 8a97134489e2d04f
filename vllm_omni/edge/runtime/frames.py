"""Checks of the codec frames a device decoder is fed (numpy only)."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidFramesError


def check_frames(frames: np.ndarray, num_quantizers: int, codebook_size: int, position: int = 0) -> np.ndarray:
    """Return ``frames`` as int64 ``[T, num_quantizers]`` or raise :class:`InvalidFramesError`.

    ``frames`` are frame-major (the codec stream's order); ``position`` (frames already decoded in
    the stream) only makes the error message point at the right frame.
    """
    frames = np.asarray(frames)
    if frames.dtype.kind not in "iu":
        raise InvalidFramesError(f"frames must be integer codes, found dtype {frames.dtype}")
    if frames.ndim != 2 or frames.shape[1] != num_quantizers:
        hint = " (codebook-major codes need .T)" if frames.ndim == 2 and frames.shape[0] == num_quantizers else ""
        raise InvalidFramesError(
            f"frames must have shape [T, {num_quantizers}] (frame-major), found {list(frames.shape)}{hint}"
        )
    if frames.size and (frames.min() < 0 or frames.max() >= codebook_size):
        bad = np.argwhere((frames < 0) | (frames >= codebook_size))[0].tolist()
        raise InvalidFramesError(
            f"codes must lie in 0..{codebook_size - 1}, found {int(frames[tuple(bad)])} at "
            f"[frame, codebook] = {bad} (stream position {position + bad[0]})"
        )
    return frames.astype(np.int64, copy=False)
