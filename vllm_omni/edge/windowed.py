"""Windowed, stateless Code2Wav: one fixed-shape window in, the audio of its trailing chunk out.

``WindowedCode2Wav`` only holds the decoder and fixes the I/O contract of one window (see
:mod:`.window_schedule`)::

    audio_codes  int64[1, Q, context_frames + chunk_frames]
 -> audio_values float32[1, chunk_frames * samples_per_frame]

It decodes the whole window exactly as the full decode would and keeps the trailing chunk, so a
window whose context is the whole stream so far reproduces the full decode. There is no state in
the graph: static shapes are what ExecuTorch partitioners (XNNPACK, QNN, CoreML) need.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder

from .manifest import INPUT_NAME, MANIFEST_SCHEMA_VERSION, OUTPUT_NAME, TensorSpec
from .runtime.windowed_decoder import WindowedDecoder
from .window_schedule import Window, window_schedule


class WindowedCode2Wav(nn.Module):
    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, window: Window):
        super().__init__()
        self.decoder = decoder
        self.window = window
        self.samples_per_frame = decoder.total_upsample

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        audio = self.decoder._forward_exact(audio_codes)
        return audio.reshape(1, -1)[:, -self.window.chunk_frames * self.samples_per_frame :]

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor]:
        config = self.decoder.config
        generator = torch.Generator().manual_seed(seed)
        shape = (1, config.num_quantizers, self.window.window_frames)
        return (torch.randint(0, config.codebook_size, shape, generator=generator, dtype=torch.int64),)

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec(INPUT_NAME, (1, self.decoder.config.num_quantizers, self.window.window_frames), "int64"),)

    def output_specs(self, dtype: str = "float32") -> tuple[TensorSpec, ...]:
        return (TensorSpec(OUTPUT_NAME, (1, self.window.chunk_frames * self.samples_per_frame), dtype),)

    def metadata(self) -> dict[str, int]:
        """What a program says about itself (ExecuTorch constant methods, the ``.pt2`` extra file)."""
        config = self.decoder.config
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "sample_rate": OUTPUT_SAMPLE_RATE,
            "samples_per_frame": self.samples_per_frame,
            "num_quantizers": config.num_quantizers,
            "codebook_size": config.codebook_size,
            "context_frames": self.window.context_frames,
            "chunk_frames": self.window.chunk_frames,
            "window_frames": self.window.window_frames,
        }


class EagerWindowRunner:
    """A window run by eager torch: the reference a program is compared with (tests, benchmarks)."""

    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, window: Window):
        self.window = window
        self.module = WindowedCode2Wav(decoder, window).eval()

    def run(self, codes: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.module(torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))).numpy().ravel()


def eager_windowed_decoder(
    decoder: Qwen3TTSTokenizerV2Decoder, ramp: Sequence[int], context_frames: int
) -> WindowedDecoder:
    """A :class:`WindowedDecoder` whose windows run in eager torch (no export)."""
    schedule = window_schedule(ramp, context_frames)
    config = decoder.config
    return WindowedDecoder(
        {window: EagerWindowRunner(decoder, window) for window in schedule},
        ramp=ramp,
        context_frames=context_frames,
        num_quantizers=config.num_quantizers,
        codebook_size=config.codebook_size,
        samples_per_frame=decoder.total_upsample,
        sample_rate=OUTPUT_SAMPLE_RATE,
    )
