"""The one interface every stream decoder offers, whatever the plan's graph kind and backend (no torch)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..geometry import CodecGeometry


@runtime_checkable
class StreamDecoder(Protocol):
    """Decodes one stream of codec frames into PCM, as the frames arrive.

    - ``feed(frames)``: frame-major integer codes ``[T, num_quantizers]`` in; the PCM now decodable
      out (``float32[samples]`` at ``codec.sample_rate``, maybe empty). Invalid frames raise
      :class:`~vllm_omni.edge.errors.InvalidFramesError` and leave the stream unchanged.
    - ``flush()``: end the stream, return the audio of the frames still pending, start a new one.
    - ``reset()``: forget the stream (state and pending frames) without decoding anything.
    """

    codec: CodecGeometry

    @property
    def position(self) -> int:
        """Frames decoded so far in this stream."""
        ...

    def feed(self, frames: np.ndarray) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...

    def reset(self) -> None: ...
