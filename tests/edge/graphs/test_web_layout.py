"""The browser's step formulation (``webgpu`` layout): sines as range-reduced polynomials, exact against the
reference, no sin or cos op and no int64 data op in the graph, int32 codes in the contract."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from vllm_omni.edge.backends.onnx.export import export_step_onnx
from vllm_omni.edge.backends.onnx.graph import graph_contract, shape_nodes
from vllm_omni.edge.builders.onnx.steps import check_step_graph
from vllm_omni.edge.builders.steps import EXACT_SNR_DB
from vllm_omni.edge.graphs.layouts import WEB_LAYOUT
from vllm_omni.edge.graphs.web_layout import cos_pi, reduce_half_turns, sin_pi, snake_beta_polynomial
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta


def test_the_polynomial_sines_are_float32_exact_over_the_reduced_range():
    reduced = torch.linspace(-0.5, 0.5, 200_001, dtype=torch.float32)
    exact = reduced.double() * math.pi
    assert (sin_pi(reduced).double() - torch.sin(exact)).abs().max() < 2.5e-7
    assert (cos_pi(reduced).double() - torch.cos(exact)).abs().max() < 2.5e-7


def test_range_reduction_keeps_the_angle_and_lands_in_half_a_turn():
    turns = torch.tensor([-1e4, -3.5, -0.75, -0.5, 0.0, 0.49, 0.5, 0.51, 2.0, 123.25, 4e5], dtype=torch.float32)
    reduced = reduce_half_turns(turns)
    assert reduced.abs().max() <= 0.5
    assert torch.equal(turns - reduced, torch.round(turns - reduced))  # whole half-turns taken off, exactly


def test_snake_beta_as_a_polynomial_equals_the_module_where_its_argument_leaves_minus_pi_to_pi():
    torch.manual_seed(0)
    module = SnakeBeta(8)
    with torch.no_grad():
        module.alpha.normal_(0.0, 1.0)
        module.beta.normal_(0.0, 1.0)
    module.precompute()
    hidden = torch.randn(1, 8, 4096) * 20.0  # a x well beyond pi: WGSL's own sin/cos would be unguaranteed here
    assert (hidden * module.alpha_exp).abs().max() > 10 * math.pi
    with torch.no_grad():
        want, got = module(hidden).double(), snake_beta_polynomial(module, hidden).double()
    # the argument's own float32 rounding (ulp of a x) bounds both; the sine's error is far below it
    assert ((got - want).abs() / module.beta_inv.double()).max() < 5e-5


@pytest.fixture(scope="module")
def web_graph(small_decoder, tmp_path_factory):
    path = tmp_path_factory.mktemp("web") / "step_b1-4.onnx"
    return export_step_onnx(small_decoder, 4, path, form="cpu", graph_layout=WEB_LAYOUT)


def test_the_web_graph_has_no_sin_or_cos_and_takes_int32_codes(web_graph):
    import onnx

    model = onnx.load(str(web_graph))
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops["Sin"] == ops["Cos"] == 0 and ops["Floor"] > 0, ops
    codes = model.graph.input[0]
    assert codes.name == "audio_codes" and codes.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert graph_contract(web_graph).codes_dtype == "int32"


def test_a_graphs_metadata_is_read_without_parsing_the_graph(web_graph):
    """What the start-up's formulation check reads: the same key/values as onnx's full load, none of the weights."""
    import onnx

    from vllm_omni.edge.backends.onnx.graph import graph_layout, graph_metadata

    model = onnx.load(str(web_graph), load_external_data=False)
    assert graph_metadata(web_graph) == {prop.key: prop.value for prop in model.metadata_props}
    assert graph_layout(web_graph) == WEB_LAYOUT


def test_only_shape_arithmetic_in_the_web_graph_reads_int64_data(web_graph):
    """What the browser test sees placed off WebGPU must be shape arithmetic: here, no node outside it reads an
    int64 tensor (the file's value types, after onnx's shape inference)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(web_graph)))
    types = {value.name: value.type.tensor_type.elem_type for value in (*model.graph.value_info, *model.graph.input)}
    types |= {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    shapes = shape_nodes(web_graph)
    int64_readers = {
        node.name
        for node in model.graph.node
        if node.name not in shapes and any(types.get(name) == onnx.TensorProto.INT64 for name in node.input[:1])
    }
    assert int64_readers == set(), sorted(int64_readers)
    assert len(shapes) > 0


def test_the_web_graph_decodes_exactly_in_onnxruntime(small_decoder, web_graph):
    match = check_step_graph(small_decoder, web_graph, first_step_frames=2)
    assert match.snr_db >= EXACT_SNR_DB, match.describe()
    assert np.isfinite(match.snr_db)
