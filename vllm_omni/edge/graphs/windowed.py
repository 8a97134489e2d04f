"""Windowed, stateless Code2Wav: one fixed-shape window in, the audio of its trailing chunk out.

``WindowedCode2Wav`` only holds the decoder and fixes the I/O contract of one window (see
:mod:`.window_contract`)::

    audio_codes  int64[1, Q, context_frames + chunk_frames]
 -> audio_values float32[1, chunk_frames * samples_per_frame]

It decodes the whole window exactly as the full decode would and keeps the trailing chunk, so a
window whose context is the whole stream so far reproduces the full decode. There is no state in
the graph: static shapes are what ExecuTorch partitioners (XNNPACK, CoreML, QNN) need.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder

from ..geometry import CodecGeometry
from .window_contract import Window, WindowContract


class WindowedCode2Wav(nn.Module):
    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, window: Window):
        super().__init__()
        self.decoder = decoder
        self.window = window
        self.contract = WindowContract(window, CodecGeometry.of_decoder(decoder, OUTPUT_SAMPLE_RATE))

    def forward(self, audio_codes: torch.Tensor) -> torch.Tensor:
        audio = self.decoder.decode_unchecked(audio_codes)
        return audio.reshape(1, -1)[:, -self.window.chunk_frames * self.contract.geometry.samples_per_frame :]

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        size = self.contract.geometry.codebook_size
        return (torch.randint(0, size, self.contract.input_shape(), generator=generator, dtype=torch.int64),)


class EagerWindowRunner:
    """A window run by eager torch: the reference a program is compared with (tests, benchmarks)."""

    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, window: Window):
        self.window = window
        self.module = WindowedCode2Wav(decoder, window).eval()

    def run(self, codes: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.module(torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))).numpy().ravel()
