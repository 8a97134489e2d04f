"""Reference stream decoders in eager torch (no export): what tests and benchmarks compare programs with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vllm_omni.edge.geometry import CodecGeometry
from vllm_omni.edge.graphs.window_contract import window_schedule
from vllm_omni.edge.graphs.windowed import EagerWindowRunner
from vllm_omni.edge.runtime.windowed_decoder import WindowedDecoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder


def eager_windowed_decoder(
    decoder: Qwen3TTSTokenizerV2Decoder, ramp: Sequence[int], context_frames: int
) -> WindowedDecoder:
    """A :class:`WindowedDecoder` whose windows run in eager torch, with the schedule of ``ramp`` and context."""
    schedule = window_schedule(ramp, context_frames)
    return WindowedDecoder(
        {window: EagerWindowRunner(decoder, window) for window in schedule},
        ramp=ramp,
        context_frames=context_frames,
        codec=CodecGeometry.of_decoder(decoder, OUTPUT_SAMPLE_RATE),
    )


def full_decode(decoder: Qwen3TTSTokenizerV2Decoder, frames: np.ndarray) -> np.ndarray:
    """The eager full decode of frame-major codes ``[T, Q]``: ``float32[T * samples_per_frame]``."""
    with torch.inference_mode():
        return decoder(torch.from_numpy(np.ascontiguousarray(frames.T[None])))[0, 0].numpy()
