"""The one registry of step-graph layouts: every formulation in it, each making a step of the same contract."""

import dataclasses
import subprocess
import sys

import pytest

from vllm_omni.edge.errors import EdgeExportError
from vllm_omni.edge.graphs.layouts import (
    DEFAULT_LAYOUT,
    GRAPH_LAYOUTS,
    NPU_LAYOUT,
    PHONE_LAYOUT,
    WEB_LAYOUT,
    get_layout,
    layouts_for,
    step_class,
)
from vllm_omni.edge.graphs.npu_layout import Code2WavNpuStep
from vllm_omni.edge.graphs.phone_layout import Code2WavPhoneStep
from vllm_omni.edge.graphs.stateful import Code2WavStep
from vllm_omni.edge.graphs.web_layout import Code2WavWebStep


def test_every_layout_is_registered_once_with_its_step_class():
    assert {name: step_class(name) for name in GRAPH_LAYOUTS} == {
        DEFAULT_LAYOUT: Code2WavStep,
        NPU_LAYOUT: Code2WavNpuStep,
        PHONE_LAYOUT: Code2WavPhoneStep,
        WEB_LAYOUT: Code2WavWebStep,
    }
    assert layouts_for("onnx") == (DEFAULT_LAYOUT, NPU_LAYOUT, WEB_LAYOUT)
    assert layouts_for("executorch") == (PHONE_LAYOUT,)
    assert layouts_for("onnx", "cpu") == (DEFAULT_LAYOUT, WEB_LAYOUT)
    assert layouts_for("onnx", "npu") == (DEFAULT_LAYOUT, NPU_LAYOUT)


def test_an_unknown_layout_is_one_error_naming_every_known_one():
    with pytest.raises(EdgeExportError, match="known: time_on_width, time_on_height, xnnpack_whole, webgpu"):
        get_layout("time_on_depth")


@pytest.mark.parametrize("name", list(GRAPH_LAYOUTS))
def test_each_layout_makes_a_step_of_the_default_steps_contract(small_decoder, name):
    """The same contract; only the webgpu layout's codes are int32."""
    step = get_layout(name).make_step(small_decoder, 4)
    assert type(step) is step_class(name)
    want = dataclasses.replace(Code2WavStep(small_decoder, 4).contract, codes_dtype=step.contract.codes_dtype)
    assert step.contract == want
    assert step.contract.codes_dtype == ("int32" if name == WEB_LAYOUT else "int64")


def test_an_option_a_layout_does_not_take_is_refused_naming_the_layouts_that_do(small_decoder):
    with pytest.raises(EdgeExportError, match="one static step size; a dynamic graph needs one of: time_on_width"):
        get_layout(PHONE_LAYOUT).make_step(small_decoder, 4, dynamic=True)
    with pytest.raises(EdgeExportError, match="pass_frames is for the time_on_height layout, found layout 'xnnpack"):
        get_layout(PHONE_LAYOUT).make_step(small_decoder, 4, pass_frames=2)
    assert get_layout(NPU_LAYOUT).make_step(small_decoder, 8, pass_frames=4).pass_frames == 4


def test_the_onnx_export_refuses_a_layout_of_another_exporter(small_decoder, tmp_path):
    from vllm_omni.edge.backends.onnx.export import export_step_onnx

    with pytest.raises(EdgeExportError, match="xnnpack_whole layout is exported by executorch, not to ONNX"):
        export_step_onnx(small_decoder, 4, tmp_path / "phone.onnx", form="npu", graph_layout=PHONE_LAYOUT)
    assert not (tmp_path / "phone.onnx").exists()
    with pytest.raises(
        EdgeExportError, match="the npu form takes the layouts time_on_width, time_on_height, not 'webgpu'"
    ):
        export_step_onnx(small_decoder, 4, tmp_path / "web.onnx", form="npu", graph_layout=WEB_LAYOUT)
    assert not (tmp_path / "web.onnx").exists()


def test_the_registry_names_its_layouts_without_importing_torch():
    code = "import sys, vllm_omni.edge.graphs.layouts as m; print(list(m.GRAPH_LAYOUTS), 'torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["['time_on_width',", "'time_on_height',", "'xnnpack_whole',", "'webgpu']", "False"]
