"""The phone formulation (what XNNPACK delegates whole): the same function, cache and contract as the step."""

import numpy as np
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.graphs.phone_layout import Code2WavPhoneStep
from vllm_omni.edge.graphs.stateful import Code2WavStep, TorchStepRunner
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.testing.codes import random_codes


def test_the_phone_step_streams_the_full_decode_and_the_steps_audio(small_decoder):
    frames = random_codes(38, seed=5)[0].T.numpy()  # first B=2, then B=4 steps, then a padded flush
    with torch.inference_mode():
        full = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    outputs = {}
    for cls in (Code2WavStep, Code2WavPhoneStep):
        decoder = StatefulDecoder(TorchStepRunner(cls(small_decoder, 4)), first=TorchStepRunner(cls(small_decoder, 2)))
        outputs[cls] = np.concatenate([decoder.feed(frames[:3]), decoder.feed(frames[3:]), decoder.flush()])
    assert snr_db(full, outputs[Code2WavPhoneStep]) >= 110
    assert np.abs(outputs[Code2WavPhoneStep] - outputs[Code2WavStep]).max() < 1e-5


def test_one_phone_step_gives_the_steps_cache_and_contract(small_decoder):
    step, phone = Code2WavStep(small_decoder, 4), Code2WavPhoneStep(small_decoder, 4)
    assert phone.contract == step.contract
    rng = np.random.default_rng(1)
    inputs = list(step.example_inputs())
    inputs[0] = torch.from_numpy(rng.integers(0, 2048, size=(1, 16, 4)))
    inputs[3] = torch.from_numpy(rng.standard_normal(step.contract.cache_numel).astype(np.float32))
    inputs[2] = torch.tensor([3.0])  # some history slots still unwritten
    with torch.inference_mode():
        (audio, cache), (audio_phone, cache_phone) = step(*inputs), phone(*inputs)
    assert torch.allclose(cache, cache_phone, atol=1e-5) and torch.allclose(audio, audio_phone, atol=1e-5)


def test_the_codebook_vectors_are_divided_out_once_and_equal_the_modules(small_decoder):
    phone = Code2WavPhoneStep(small_decoder, 2)
    quantizer = small_decoder.quantizer
    codebooks = [layer._codebook for group in (quantizer.rvq_first, quantizer.rvq_rest) for layer in group.vq.layers]
    for index, codebook in enumerate(codebooks):
        assert torch.equal(getattr(phone, f"codebook_{index}"), codebook.embedding().detach())
    codes = random_codes(3, seed=2)
    with torch.inference_mode():
        assert torch.allclose(phone._codebooks(codes), quantizer.decode(codes), atol=1e-6)
