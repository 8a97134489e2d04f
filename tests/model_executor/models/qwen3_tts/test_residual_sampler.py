"""The counter-based sampler: uniforms strictly inside (0, 1), so a sampled code is never one the filters removed."""

from __future__ import annotations

import torch

from vllm_omni.model_executor.models.qwen3_tts.residual_sampler import (
    CODEBOOK0_GROUP,
    ResidualSampling,
    unit_interval,
)


def test_uniforms_never_reach_0_or_1():
    bits = torch.tensor([0, -1, (1 << 63) - 1, -(1 << 63), 1 << 40], dtype=torch.int64)  # top 24 bits: 0 and all ones
    u = unit_interval(bits)
    assert u.dtype == torch.float32 and bool(((u > 0) & (u < 1)).all()), u.tolist()
    assert float(u[1]) == 1.0 - 2.0**-24  # all ones: the largest float32 below 1, not 1
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_a_sampled_codebook_0_code_is_never_one_the_filters_removed():
    """Official codebook-0 settings (temperature 0.9, top-k 50) over rows whose control range is at -inf: 6,400
    draws of 3,072 uniforms each, so the hash's top value (one in 2^24) comes up; it made a NaN that argmax took,
    a control code, which no codec decodes (a server's codec stream failed on it: InvalidFramesError)."""
    generator = torch.Generator().manual_seed(0)
    rows, width, eos = 64, 3072, 2150
    for step in range(100):  # the old rounding made a control code at step 40 of these
        logits = torch.randn(rows, width, generator=generator) * 10 ** (
            torch.rand(rows, 1, generator=generator) * 3 - 1
        )
        logits[:, 2048:] = float("-inf")
        if step % 2:
            logits[:, eos] = torch.randn(rows, generator=generator)
        sampling = ResidualSampling(
            False,
            torch.zeros(rows, dtype=torch.bool),
            torch.full((rows,), 0.9),
            torch.full((rows,), 50, dtype=torch.int64),
            torch.ones(rows),
            torch.randint(0, 1 << 62, (rows,), generator=generator),
            torch.randint(0, 500, (rows,), generator=generator),
        )
        codes = sampling.pick(CODEBOOK0_GROUP, logits)
        kept = torch.isfinite(logits.gather(1, codes.unsqueeze(1))).squeeze(1)
        assert bool(kept.all()), f"step {step}: sampled {codes[~kept].tolist()}, codes the filters removed"
