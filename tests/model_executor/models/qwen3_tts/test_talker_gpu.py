"""GPU smoke test of the talker's per-step work: the batched code predictor, the residual sampler and the
codebook-0 rules, on a CUDA device. Skipped where there is none (a documented skip: tests/conftest.py).

Everything a step makes must live on the logits' device and no step may touch a global RNG; on CPU this
is checked by the talker's own tests, here on the device a GPU server runs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_omni.model_executor.models.qwen3_tts.code_predictor import Qwen3TTSCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSCodePredictorConfig
from vllm_omni.model_executor.models.qwen3_tts.residual_sampler import ResidualSampling
from vllm_omni.model_executor.models.qwen3_tts.talker_requests import (
    TalkerBatch,
    TalkerRequestSpec,
    apply_codebook0_rules,
)

pytestmark = pytest.mark.vllm
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU smoke test)")

ROWS = 6


def sampling(device: str, rows: slice = slice(None)) -> ResidualSampling:
    greedy = torch.tensor([True, False, False, True, False, False])
    return ResidualSampling(
        greedy=greedy[rows].to(device),
        temperature=torch.full((ROWS,), 0.9)[rows].to(device),
        top_k=torch.tensor([0, 50, 10, 0, 0, 2])[rows].to(device),
        top_p=torch.tensor([1.0, 1.0, 0.8, 1.0, 0.5, 1.0])[rows].to(device),
        seeds=torch.arange(ROWS, dtype=torch.int64)[rows].to(device) * 7919,
        frames=torch.arange(ROWS, dtype=torch.int64)[rows].to(device),
    )


@needs_cuda
def test_the_batched_code_predictor_and_sampler_run_on_the_gpu_without_a_global_rng():
    config = Qwen3TTSCodePredictorConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, num_code_groups=16,
    )  # fmt: skip
    torch.manual_seed(0)
    predictor = Qwen3TTSCodePredictor(config, 128).eval()
    hidden, code0 = torch.randn(ROWS, 128), torch.randn(ROWS, 128)
    on_cpu = predictor.predict(hidden, code0, sampling("cpu"))
    predictor.cuda()
    rng = torch.cuda.get_rng_state(), torch.get_rng_state()
    on_gpu = predictor.predict(hidden.cuda(), code0.cuda(), sampling("cuda"))
    assert on_gpu.device.type == "cuda" and on_gpu.shape == (ROWS, 15)
    assert torch.equal(torch.cuda.get_rng_state(), rng[0]) and torch.equal(torch.get_rng_state(), rng[1])
    greedy = sampling("cpu").greedy
    assert torch.equal(on_gpu.cpu()[greedy], on_cpu[greedy])  # fp32 on both: the argmax rows agree
    alone = predictor.predict(hidden[1:2].cuda(), code0[1:2].cuda(), sampling("cuda", slice(1, 2)))
    assert torch.equal(alone, on_gpu[1:2])  # a sampled row is the same alone or batched


@needs_cuda
def test_the_codebook0_rules_apply_on_the_gpu():
    batch = TalkerBatch()
    batch.configure(rows=4, codec_vocab=2048, eos_token_id=2047, device=torch.device("cuda"))
    spec = TalkerRequestSpec(request_key="gpu", trailing_text_ids=(), repetition_penalty=2.0, min_new_tokens=2)
    batch.add(0, SimpleNamespace(extra_args=spec.to_extra_args(), max_tokens=10), [1, 2], [])
    batch.tables.history[0, 5] = True
    logits = apply_codebook0_rules(torch.ones(1, 2048 + 15 * 8, device="cuda"), batch.tables, 2048, 2047)
    assert logits.device.type == "cuda" and torch.isinf(logits[0, 1024:]).all()
    assert logits[0, 5].item() == 0.5 and logits[0, 4].item() == 1.0
