"""The fused code predictor: the reference's codes, in a fraction of its ATen ops (what a GPU launches per step)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_omni.model_executor.models.qwen3_tts.code_predictor_graphs import BucketedCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.fused_code_predictor import FusedCodePredictor

# ATen ops of one step at the 0.6B code predictor's sizes (5 layers, 15 passes), any batch: torch 2.13 (pinned).
FUSED_OPS = {"greedy": 1129, "sampled": 1490}


def _inputs(gpu_check, rows: int, width: int, mode: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden, code0 = (torch.randn(rows, width, generator=generator) for _ in range(2))
    sampling = gpu_check.sampling(rows, "cpu", seed=seed)
    if mode == "greedy":
        sampling = dataclasses.replace(sampling, all_greedy=True, greedy=torch.ones(rows, dtype=torch.bool))
    elif mode == "sampled":
        sampling = dataclasses.replace(sampling, greedy=torch.zeros(rows, dtype=torch.bool))
    return hidden, code0, sampling


@pytest.mark.parametrize("geometry", ["small", "0.6b", "1.7b"])
def test_codes_equal_the_reference_greedy_sampled_and_mixed(gpu_check, geometry: str):
    predictor, width = gpu_check.code_predictor(geometry)
    fused = FusedCodePredictor(predictor)
    for rows, mode, seed in ((1, "greedy", 0), (3, "sampled", 1), (16, "mixed", 2), (5, "mixed", 3)):
        inputs = _inputs(gpu_check, rows, width, mode, seed)
        assert torch.equal(fused.predict(*inputs), predictor.predict(*inputs)), (rows, mode)


def test_a_projection_from_a_wider_talker_is_folded_into_the_code_tables(gpu_check):
    predictor, _ = gpu_check.code_predictor("small")  # talker 96 wide, predictor 64: a real projection
    assert isinstance(predictor.small_to_mtp_projection, torch.nn.Linear)
    fused = FusedCodePredictor(predictor)
    assert fused.tables[0].shape == (predictor.config.vocab_size, predictor.config.hidden_size)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_a_step_takes_at_least_four_times_fewer_aten_ops(gpu_check, mode: str):
    predictor, width = gpu_check.code_predictor("0.6b")
    fused = FusedCodePredictor(predictor)
    counts = {}
    cpu = torch.device("cpu")
    for rows in (1, 16):
        inputs = _inputs(gpu_check, rows, width, mode)
        fused.predict(*inputs)  # the workspace of this batch size exists from here on
        counts[rows] = (  # ATen ops dispatched, views included (kernels_per_step on a CPU)
            gpu_check.kernels_per_step(cpu, lambda i=inputs: predictor.predict(*i)),
            gpu_check.kernels_per_step(cpu, lambda i=inputs: fused.predict(*i)),
        )
    assert counts[1] == counts[16], counts  # the count does not grow with the batch
    reference_ops, fused_ops = counts[1]
    assert fused_ops == FUSED_OPS[mode], counts
    assert reference_ops >= 4 * fused_ops, counts


def test_workspaces_are_bounded_and_padded_rows_never_change_real_rows(gpu_check):
    predictor, width = gpu_check.code_predictor("small")
    fused = FusedCodePredictor(predictor)
    for rows in range(1, FusedCodePredictor.MAX_WORKSPACES + 4):
        fused.predict(*_inputs(gpu_check, rows, width, "mixed", rows))
    assert len(fused._workspaces) == FusedCodePredictor.MAX_WORKSPACES
    one_row = fused.workspace(1).nbytes
    fused.MAX_WORKSPACE_BYTES = 3 * one_row  # bytes bound them too; the newest always stays
    fused.predict(*_inputs(gpu_check, 2, width, "mixed"))
    kept = fused._workspaces
    assert 2 in kept and sum(space.nbytes for space in kept.values()) <= 3 * one_row
    bucketed = BucketedCodePredictor(fused, buckets=(4,))
    for rows in (1, 3, 4, 6):  # 6: beyond the largest bucket, padded to its multiple (8)
        inputs = _inputs(gpu_check, rows, width, "mixed", 10 + rows)
        assert torch.equal(bucketed.predict(*inputs), predictor.predict(*inputs)), rows
