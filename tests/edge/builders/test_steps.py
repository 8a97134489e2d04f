"""Stateful step graphs in a build: exported, checked against the full decode, or refused."""

import pytest

from vllm_omni.edge.builders import steps
from vllm_omni.edge.errors import EdgeExportError


def test_a_graph_that_fails_its_check_leaves_no_file_behind(small_decoder, tmp_path, monkeypatch):
    monkeypatch.setattr(steps, "EXACT_SNR_DB", 1e9)  # an impossible bar
    with pytest.raises(EdgeExportError, match="do not ship it"):
        steps.export_checked_step(small_decoder, 2, tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_checked_graph_reaches_its_path_and_reads_back_its_contract(small_decoder, tmp_path):
    path = steps.export_checked_step(small_decoder, 2, tmp_path / "step_b2.onnx")
    assert path == tmp_path / "step_b2.onnx" and [p.name for p in tmp_path.iterdir()] == ["step_b2.onnx"]
    assert steps.check_step_graph(small_decoder, path) >= steps.EXACT_SNR_DB
