"""The Rockchip NPU formulation (time on the height axis, polyphase dilated and transposed convs): same function,
static graph."""

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.graphs.layouts import NPU_LAYOUT
from vllm_omni.edge.graphs.npu_layout import Code2WavNpuStep
from vllm_omni.edge.graphs.stateful import Code2WavStep, TorchStepRunner
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.testing.codes import random_codes


def test_the_npu_step_streams_the_cpu_steps_audio_and_cache(small_decoder):
    frames = random_codes(38, seed=3)[0].T.numpy()  # first B=2, then B=4 steps, then a padded flush
    with torch.inference_mode():
        full = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    outputs = {}
    for cls in (Code2WavStep, Code2WavNpuStep):
        decoder = StatefulDecoder(TorchStepRunner(cls(small_decoder, 4)), first=TorchStepRunner(cls(small_decoder, 2)))
        outputs[cls] = np.concatenate([decoder.feed(frames), decoder.flush()])
    assert np.abs(outputs[Code2WavNpuStep] - outputs[Code2WavStep]).max() < 1e-5
    assert snr_db(full, outputs[Code2WavNpuStep]) > 100


def test_one_step_gives_the_same_cache_as_the_cpu_step(small_decoder):
    cpu, npu = Code2WavStep(small_decoder, 4), Code2WavNpuStep(small_decoder, 4)
    rng = np.random.default_rng(0)
    inputs = list(cpu.example_inputs())
    inputs[0] = torch.from_numpy(rng.integers(0, 2048, size=(1, 16, 4)))
    inputs[3] = torch.from_numpy(rng.standard_normal(cpu.contract.cache_numel).astype(np.float32))
    inputs[2] = torch.tensor([5.0])
    with torch.inference_mode():
        (audio_cpu, cache_cpu), (audio_npu, cache_npu) = cpu(*inputs), npu(*inputs)
    assert torch.allclose(cache_cpu, cache_npu, atol=1e-5) and torch.allclose(audio_cpu, audio_npu, atol=1e-5)


def test_the_npu_graph_is_static_records_its_layout_and_has_no_dilated_conv(small_decoder, tmp_path):
    import onnx

    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.backends.onnx.graph import graph_layout, op_report

    npu = export_step_onnx(small_decoder, 4, tmp_path / "npu.onnx", graph_layout=NPU_LAYOUT)
    cpu = export_step_onnx(small_decoder, 4, tmp_path / "cpu.onnx")
    assert graph_layout(npu) == NPU_LAYOUT and graph_layout(cpu) == "time_on_width"
    assert "qwen3_tts.graph_layout" not in {p.key for p in onnx.load(str(cpu)).metadata_props}
    report = op_report(npu)
    assert not report.risky, report.summary()  # no Shape, ConstantOfShape, Pad, Neg, ...
    assert not {"Shape", "ConstantOfShape", "Pad", "Tile", "Expand", "Where"} & set(report.op_counts)
    # ConvTranspose is left only in the short upsample stage: the waveform blocks run phase convs
    assert report.op_counts.get("ConvTranspose", 0) == len(small_decoder.upsample)
    for node in onnx.load(str(npu)).graph.node:
        if node.op_type == "Conv":
            dilations = [list(a.ints) for a in node.attribute if a.name == "dilations"]
            assert all(d == [1] * len(d) for d in dilations), node.name


@pytest.mark.parametrize(("pass_frames", "expected"), [(4, 4), (3, 2), (8, 8)])
def test_a_step_in_passes_gives_the_single_pass_audio_and_cache(small_decoder, pass_frames, expected):
    single, passes = Code2WavNpuStep(small_decoder, 8), Code2WavNpuStep(small_decoder, 8, pass_frames=pass_frames)
    assert passes.pass_frames == expected and passes.contract == single.contract
    rng = np.random.default_rng(1)
    inputs = list(single.example_inputs())
    inputs[0] = torch.from_numpy(rng.integers(0, 2048, size=(1, 16, 8)))
    inputs[1] = torch.from_numpy(rng.uniform(0, 3, size=tuple(inputs[1].shape)).astype(np.float32))
    inputs[3] = torch.from_numpy(rng.standard_normal(single.contract.cache_numel).astype(np.float32))
    for valid in (0.0, 3.0, float(single.contract.kv_slots)):  # a fresh stream, a young one, a full window
        inputs[2] = torch.tensor([valid])
        with torch.inference_mode():
            (audio, cache), (audio_passes, cache_passes) = single(*inputs), passes(*inputs)
        assert torch.allclose(audio, audio_passes, atol=1e-5) and torch.allclose(cache, cache_passes, atol=1e-5)


def test_a_graph_in_passes_records_them_and_equals_the_full_decode(small_decoder, tmp_path):
    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.backends.onnx.graph import graph_contract, graph_pass_frames
    from vllm_omni.edge.builders.onnx.steps import check_step_graph
    from vllm_omni.edge.errors import EdgeExportError

    path = export_step_onnx(small_decoder, 8, tmp_path / "passes.onnx", graph_layout=NPU_LAYOUT, pass_frames=4)
    assert graph_pass_frames(path) == 4 and graph_contract(path).step_frames == 8
    single = export_step_onnx(small_decoder, 8, tmp_path / "single.onnx", graph_layout=NPU_LAYOUT)
    assert path.stat().st_size < 1.05 * single.stat().st_size  # the weights once, not once per pass
    assert check_step_graph(small_decoder, path).snr_db >= 110
    one_pass = export_step_onnx(small_decoder, 2, tmp_path / "one.onnx", graph_layout=NPU_LAYOUT, pass_frames=4)
    assert graph_pass_frames(one_pass) is None  # a step no longer than a pass is one pass
    with pytest.raises(EdgeExportError, match="pass_frames is for the time_on_height layout"):
        export_step_onnx(small_decoder, 8, tmp_path / "cpu.onnx", pass_frames=4)


def test_the_dynamic_npu_graph_runs_each_step_size_like_the_static_graphs(small_decoder, tmp_path):
    """npu_dynamic: one graph at a symbolic B (for rknn-toolkit2's dynamic_input) with the static graphs' ops,
    exact on a mixed first/main schedule, and equal per step size to the static graph of that size."""
    import onnx

    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.backends.onnx.graph import graph_contract, op_report
    from vllm_omni.edge.backends.onnx.run import OnnxStepGraph, OnnxStepRunner

    path = export_step_onnx(small_decoder, 4, tmp_path / "dyn.onnx", form="npu_dynamic", graph_layout=NPU_LAYOUT)
    contract = graph_contract(path)
    assert (contract.step_frames, contract.max_step_frames) == (4, 4)
    report = op_report(path)
    assert report.risky_for(symbolic_b=True) == {} and set(report.risky) == {"Shape"}  # only B is read
    assert not {"ConstantOfShape", "Range", "Pad", "Tile", "Expand", "Where"} & set(report.op_counts)
    for node in onnx.load(str(path)).graph.node:  # polyphase, as in the static graph
        if node.op_type == "Conv":
            assert all(list(a.ints) == [1] * len(a.ints) for a in node.attribute if a.name == "dilations"), node.name
    graph = OnnxStepGraph(path)
    frames = random_codes(38, seed=3)[0].T.numpy()
    with torch.inference_mode():
        full = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    decoder = StatefulDecoder(graph.runner(4), first=graph.runner(2))
    assert snr_db(full, np.concatenate([decoder.feed(frames), decoder.flush()])) > 100
    rng = np.random.default_rng(0)
    for frames_per_step in (2, 4):  # one step from a random cache: the same audio and cache as the static graph
        static = export_step_onnx(
            small_decoder, frames_per_step, tmp_path / f"b{frames_per_step}.onnx", graph_layout=NPU_LAYOUT
        )
        inputs = (
            rng.integers(0, 2048, size=(1, 16, frames_per_step)),
            rng.uniform(0, 6.28, size=(frames_per_step, 16)).astype(np.float32),
            np.array([3.0], dtype=np.float32),
            rng.standard_normal(contract.cache_numel).astype(np.float32),
        )
        pairs = zip(graph.runner(frames_per_step).run(*inputs), OnnxStepRunner(static).run(*inputs), strict=True)
        for got, want in pairs:
            assert np.abs(got - want).max() < 1e-5


def test_the_dynamic_form_needs_the_npu_layout(small_decoder, tmp_path):
    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.errors import EdgeExportError

    with pytest.raises(EdgeExportError, match="npu_dynamic form takes the layouts time_on_height, not 'time_on_width'"):
        export_step_onnx(small_decoder, 4, tmp_path / "dyn.onnx", form="npu_dynamic")


def test_a_graph_at_a_symbolic_b_has_no_passes(small_decoder):
    from vllm_omni.edge.errors import EdgeExportError

    with pytest.raises(EdgeExportError, match="cannot decode in passes"):
        Code2WavNpuStep(small_decoder, 8, pass_frames=4, dynamic=True)
    assert Code2WavNpuStep(small_decoder, 8, pass_frames=8, dynamic=True).one_pass is None


def test_each_selection_constant_of_the_npu_graphs_has_one_matmul_reader(small_decoder, tmp_path):
    """K and V stacked on the head axis (issue 28): with dynamic_input, rknn-toolkit2 2.5.0 lowers only the first
    MatMul that reads a folded selection constant; the second (V's, in the split form) became an Einsum on the CPU
    with no lowering (docs/hardware/rockchip-npu.md, "Ops off the NPU")."""
    import re
    from collections import Counter

    import onnx

    from vllm_omni.edge.backends.onnx.export import export_step_onnx

    layers = small_decoder.config.num_hidden_layers
    for form in ("npu", "npu_dynamic"):
        path = export_step_onnx(small_decoder, 4, tmp_path / f"{form}.onnx", form=form, graph_layout=NPU_LAYOUT)
        graph = onnx.load(str(path)).graph
        constants = {init.name for init in graph.initializer}
        constants |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
        constants |= {node.output[0] for node in graph.node if node.op_type == "Slice" and node.input[0] in constants}
        matmuls = [node for node in graph.node if node.op_type == "MatMul"]
        readers = Counter(name for node in matmuls for name in node.input if name in constants)
        assert readers and max(readers.values()) == 1, {name: n for name, n in readers.items() if n > 1}
        # the step's own (not a module's), per layer: the [K; V] projection, history, new, next history,
        # grouped-head repeat, scores, attended (the split form had 10: K and V each projected and selected)
        own = [node for node in matmuls if re.fullmatch(r"/MatMul(_\d+)?", node.name)]
        assert len(own) == 7 * layers, (form, [node.name for node in own])


def test_the_stacked_attention_refuses_a_layout_whose_key_and_value_are_apart(small_decoder):
    import dataclasses

    from vllm_omni.edge.errors import EdgeExportError
    from vllm_omni.edge.graphs.step_contract import CacheLayout

    step = Code2WavNpuStep(small_decoder, 4)
    entries = [(entry.name, entry.shape) for entry in step.contract.layout.entries]
    value = next(index for index, (name, _) in enumerate(entries) if name == "pre_transformer.layers.0.value")
    entries.insert(value - 1, entries.pop(0))  # pre_conv between layer 0's key and value
    step.contract = dataclasses.replace(step.contract, layout=CacheLayout.from_shapes(entries))
    with pytest.raises(EdgeExportError, match="does not keep .key and .value adjacent"), torch.inference_mode():
        step(*step.example_inputs())
