"""Stateful step graphs in a build: exported, checked against the full decode, or refused."""

import numpy as np
import pytest
import torch

from vllm_omni.edge.builders import steps
from vllm_omni.edge.builders.onnx import steps as onnx_steps
from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.edge.errors import EdgeExportError
from vllm_omni.edge.plan.model import ExecPlan


def test_a_graph_that_fails_its_check_leaves_no_file_behind(small_decoder, tmp_path, monkeypatch):
    monkeypatch.setattr(steps, "EXACT_SNR_DB", 1e9)  # an impossible bar, in SNR and against full scale
    with pytest.raises(EdgeExportError, match="do not ship it"):
        onnx_steps.export_checked_step(small_decoder, 2, tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_checked_graph_reaches_its_path_and_reads_back_its_contract(small_decoder, tmp_path):
    path = onnx_steps.export_checked_step(small_decoder, 2, tmp_path / "step_b2.onnx")
    assert path == tmp_path / "step_b2.onnx" and [p.name for p in tmp_path.iterdir()] == ["step_b2.onnx"]
    assert onnx_steps.check_step_graph(small_decoder, path).snr_db >= steps.EXACT_SNR_DB


def test_a_correct_graph_of_a_near_silent_checkpoint_builds(near_silent_checkpoint, build_plan, edge_args, tmp_path):
    """Issue 26: a decode of RMS ~1e-8 is a few dB from the full decode in SNR, yet its error is ~1e-8
    (about -160 dBFS); the build judges that against full scale and ships the plan."""
    checkpoint = near_silent_checkpoint
    decoder = load_code2wav_decoder(checkpoint)
    codes = steps.seeded_codes(16, decoder.config.num_quantizers, decoder.config.codebook_size, seed=7)
    with torch.inference_mode():
        rms = float(decoder(codes).square().mean().sqrt())
    assert 1e-10 < rms < 1e-7

    plan = ExecPlan.load(build_plan(checkpoint, tmp_path / "plan", "cpu_x86_64", *edge_args["step"]))
    for role in ("first", "main"):
        check = plan.artifacts[role].verification
        assert check["snr_db"] < steps.EXACT_SNR_DB  # SNR alone refused this graph
        assert 0 < check["max_abs_diff"] <= 10 ** (-steps.EXACT_SNR_DB / 20) and np.isfinite(check["snr_db"])
