"""The stateful step in torch: cache layout and exactness against the full decode."""

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db as snr
from vllm_omni.edge.graphs.stateful import Code2WavStep, TorchStepRunner, cache_layout
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.testing.codes import random_codes

STREAM_FRAMES = 101  # > 10x the small geometry's window of 8, and not a multiple of any tested B


@pytest.fixture(scope="module")
def stream(small_decoder):
    codes = random_codes(STREAM_FRAMES, seed=7)
    with torch.inference_mode():
        full = small_decoder(codes)[0, 0].numpy()
    return codes[0].T.numpy(), full


def decode(decoder: StatefulDecoder, frames: np.ndarray, pieces: list[int]) -> np.ndarray:
    out, start = [], 0
    for size in pieces:
        out.append(decoder.feed(frames[start : start + size]))
        start += size
    out += [decoder.feed(frames[start:]), decoder.flush()]
    return np.concatenate(out)


def test_released_cache_is_1303424_floats_whatever_the_step_size():
    with torch.device("meta"):
        decoder = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig.released())
    layout = cache_layout(decoder)
    assert layout.numel == 1_303_424
    kv = sum(e.numel for e in layout.entries if e.name.endswith((".key", ".value")))
    assert kv == 71 * 8 * 2 * 16 * 64
    assert layout.entry("decoder.1.block.1").shape == (1536, 2)  # ConvTranspose k=16 s=8: ceil(15/8) frames
    assert layout.entry("decoder.4.block.4.conv1").shape == (96, 54)  # k=7 dilation 9


def test_layout_is_contiguous_and_shared_by_every_step_size(small_decoder):
    contracts = [Code2WavStep(small_decoder, b).contract for b in (1, 4, 64)]
    assert len({c.cache_numel for c in contracts}) == 1
    assert contracts[0].shares_cache_with(contracts[2])
    offset = 0
    for entry in contracts[0].layout.entries:
        assert entry.offset == offset
        offset += entry.numel
    assert offset == contracts[0].cache_numel


@pytest.mark.parametrize("step_frames", [1, 2, 4, 16, 25, 64])
def test_stepwise_decode_equals_full_decode(small_decoder, stream, step_frames):
    frames, full = stream
    decoder = StatefulDecoder(TorchStepRunner(Code2WavStep(small_decoder, step_frames)))
    audio = decode(decoder, frames, [])
    assert audio.shape == full.shape
    assert snr(full, audio) >= 90
    assert np.abs(audio - full).max() < 1e-5


def test_small_first_step_then_large_main_step_share_the_cache(small_decoder, stream):
    frames, full = stream
    decoder = StatefulDecoder(
        TorchStepRunner(Code2WavStep(small_decoder, 16)), first=TorchStepRunner(Code2WavStep(small_decoder, 2))
    )
    first_audio = decoder.feed(frames[:2])
    assert first_audio.size == 2 * 48  # the first step answers after 2 frames, not 16
    audio = np.concatenate([first_audio, decode(decoder, frames[2:], [5, 30, 1])])
    assert snr(full, audio) >= 90


def test_frames_arriving_in_odd_pieces_give_the_same_audio(small_decoder, stream):
    frames, full = stream
    decoder = StatefulDecoder(TorchStepRunner(Code2WavStep(small_decoder, 4)))
    audio = decode(decoder, frames, [1, 2, 3, 7, 11, 0, 13])
    assert snr(full, audio) >= 90
