"""Stateful step graphs exported to ONNX and run by onnxruntime (small geometry)."""

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.backends.onnx.export import export_step_onnx
from vllm_omni.edge.backends.onnx.graph import graph_contract, op_report
from vllm_omni.edge.backends.onnx.run import OnnxStepGraph, OnnxStepRunner
from vllm_omni.edge.graphs.step_contract import StepContractError
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.testing.codes import random_codes


@pytest.fixture(scope="module")
def step_graphs(small_decoder, tmp_path_factory):
    directory = tmp_path_factory.mktemp("steps")
    return {b: export_step_onnx(small_decoder, b, directory / f"step_b{b}.onnx") for b in (2, 16)}


def test_graph_has_the_contract_names_shapes_and_dtypes(step_graphs):
    session = onnxruntime.InferenceSession(str(step_graphs[16]), providers=["CPUExecutionProvider"])
    inputs = [(i.name, i.shape, i.type) for i in session.get_inputs()]
    outputs = [(o.name, o.shape, o.type) for o in session.get_outputs()]
    n = graph_contract(step_graphs[16]).cache_numel
    assert inputs == [
        ("audio_codes", [1, 16, 16], "tensor(int64)"),
        ("freqs_in", [16, 16], "tensor(float)"),
        ("cache_valid", [1], "tensor(float)"),
        ("cache_in", [n], "tensor(float)"),
    ]
    assert outputs == [("audio_values", [16 * 48], "tensor(float)"), ("cache_out", [n], "tensor(float)")]


def test_graph_contract_reads_b_n_and_head_dim_back(step_graphs, small_decoder):
    contract = graph_contract(step_graphs[2])
    assert (contract.step_frames, contract.head_dim, contract.kv_slots, contract.samples_per_frame) == (2, 32, 7, 48)
    assert contract.cache_numel == graph_contract(step_graphs[16]).cache_numel == contract.layout.numel
    assert contract.geometry["sliding_window"] == 8
    model = onnx.load(str(step_graphs[2]), load_external_data=False)
    assert model.opset_import[0].version == 17
    assert not model.graph.initializer[0].external_data  # self-contained


def test_onnxruntime_first_and_main_steps_equal_the_full_decode(step_graphs, small_decoder):
    codes = random_codes(90, seed=11)
    with torch.inference_mode():
        full = small_decoder(codes)[0, 0].numpy()
    decoder = StatefulDecoder(OnnxStepRunner(step_graphs[16]), first=OnnxStepRunner(step_graphs[2]))
    frames = codes[0].T.numpy()
    audio = np.concatenate(
        [decoder.feed(frames[:3]), decoder.feed(frames[3:50]), decoder.feed(frames[50:]), decoder.flush()]
    )
    snr = snr_db(full, audio)
    assert snr >= 90, snr


def test_op_report_counts_nodes_and_names_risky_ops(step_graphs):
    report = op_report(step_graphs[2])
    assert report.nodes == sum(report.op_counts.values()) > 100
    assert set(report.risky) <= {
        "IsNaN",
        "Neg",
        "Range",
        "Reciprocal",
        "Pad",
        "Exp",
        "ConstantOfShape",
        "Shape",
        "Split",
    }
    assert "Neg" not in report.risky and "Reciprocal" not in report.risky and "Exp" not in report.risky


def test_a_graph_that_is_not_a_step_is_refused(tmp_path, small_decoder):
    path = tmp_path / "plain.onnx"
    torch.onnx.export(small_decoder, (random_codes(3),), str(path), opset_version=17, dynamo=False)
    with pytest.raises(StepContractError, match="not a Qwen3-TTS stateful step graph"):
        graph_contract(path)
    (tmp_path / "junk.onnx").write_bytes(b"not onnx at all")
    with pytest.raises(StepContractError, match="not a readable ONNX file"):
        graph_contract(tmp_path / "junk.onnx")


@pytest.fixture(scope="module")
def cpu_graph(small_decoder, tmp_path_factory):
    return export_step_onnx(small_decoder, 16, tmp_path_factory.mktemp("cpu") / "step_b1-16.onnx", form="cpu")


def test_the_cpu_form_is_one_graph_for_every_step_size(cpu_graph, step_graphs, small_decoder):
    contract = graph_contract(cpu_graph)
    assert (contract.step_frames, contract.max_step_frames, contract.dynamic) == (16, 16, True)
    assert contract.shares_cache_with(graph_contract(step_graphs[2]))  # a cache from either form feeds the other
    session = onnxruntime.InferenceSession(str(cpu_graph), providers=["CPUExecutionProvider"])
    assert [i.shape for i in session.get_inputs()][:2] == [[1, 16, "step_frames"], ["step_frames", 16]]
    model = onnx.load(str(cpu_graph), load_external_data=False)
    ops = {node.op_type for node in model.graph.node}
    assert "Pow" not in ops and "Pad" not in ops and "ConstantOfShape" not in ops
    assert all(len(i.dims) == 4 for i in model.graph.initializer if i.name.endswith("conv.weight"))
    # any B up to 16, in one stream, and switching the step size on the way: still the full decode
    graph = OnnxStepGraph(cpu_graph)
    codes = random_codes(97, seed=12)
    with torch.inference_mode():
        full = small_decoder(codes)[0, 0].numpy()
    frames, pieces = codes[0].T.numpy(), []
    for size in (1, 3, 16, 7):
        decoder = StatefulDecoder(graph.runner(size), first=graph.runner(2))
        pieces = [decoder.feed(frames[:40]), decoder.feed(frames[40:]), decoder.flush()]
        assert snr_db(full, np.concatenate(pieces)) >= 110
    static = StatefulDecoder(OnnxStepRunner(step_graphs[16]))  # the static NPU form agrees with it
    assert snr_db(full, np.concatenate([static.feed(frames), static.flush()])) >= 110


def test_a_graph_refuses_step_sizes_it_does_not_take(cpu_graph, step_graphs):
    graph = OnnxStepGraph(cpu_graph)
    for size in (0, 17):
        with pytest.raises(StepContractError, match="takes 1..16 frames per step, not"):
            graph.runner(size)
    with pytest.raises(StepContractError, match="takes exactly 2 frames per step, not 4"):
        OnnxStepRunner(step_graphs[2], step_frames=4)


def test_a_static_graph_keeps_its_metadata(step_graphs):
    metadata = {p.key for p in onnx.load(str(step_graphs[2]), load_external_data=False).metadata_props}
    assert "qwen3_tts.max_step_frames" not in metadata  # NPU graphs (and their plan ids) are as before
