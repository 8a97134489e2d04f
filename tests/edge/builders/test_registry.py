"""The builder registry: the builder each hardware class names, plugin builders through the entry-point group."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from vllm_omni.edge.builders.registry import (
    BUILTIN_BUILDERS,
    ENTRY_POINT_GROUP,
    UnknownBuilderError,
    build,
    builder_names,
    get_builder,
)
from vllm_omni.edge.builders.request import BuildRequest
from vllm_omni.edge.hardware import get_hardware_class, hardware_classes

from ..plugin_package import install_plugin


def test_every_graph_kind_of_every_class_has_a_builder_and_every_builder_a_class():
    named = {}
    for record in hardware_classes().values():
        for kind in record.graph_kinds:
            named[(record.name, kind)] = get_builder(record.builder_for(kind)).__name__
    assert named == {
        ("npu_phone", "windowed"): "build_windowed",
        ("npu_phone", "stateful"): "build_executorch_steps",
        ("rockchip_npu", "stateful"): "build_rknn",
        ("cpu_x86_64", "stateful"): "build_onnx_steps",
        ("cpu_arm64", "stateful"): "build_onnx_steps",
        ("browser", "stateful"): "build_onnx_steps",
    }
    assert {builder.__name__ for builder in BUILTIN_BUILDERS.values()} == set(named.values())


def test_an_unknown_builder_names_the_known_ones_before_any_work(tmp_path):
    with pytest.raises(UnknownBuilderError, match="unknown builder 'tflite'; known: windowed, onnx_steps, "):
        get_builder("tflite")
    toaster = dataclasses.replace(get_hardware_class("cpu_x86_64"), name="toaster", builder="tflite")
    out_dir = tmp_path / "plan"
    with pytest.raises(UnknownBuilderError, match="hardware class 'toaster': unknown builder 'tflite'; known: "):
        build(toaster, BuildRequest(model="unused", out_dir=out_dir))
    assert not out_dir.exists()


def test_a_builder_from_another_package_registers_through_the_entry_point_group(tmp_path, monkeypatch):
    install_plugin(
        tmp_path,
        monkeypatch,
        "edge_builder_demo",
        (
            "CALLS = []\n"
            "def build_tv_box(hardware_class, request):\n"
            "    CALLS.append((hardware_class.name, request.out_dir.name))\n"
            "    return 'the plan'\n"
        ),
        ENTRY_POINT_GROUP,
        "tv_box = edge_builder_demo:build_tv_box",
    )
    tv_box = dataclasses.replace(get_hardware_class("cpu_x86_64"), name="tv_box", builder="tv_box")
    try:
        assert builder_names()[-1] == "tv_box"
        assert build(tv_box, BuildRequest(model="unused", out_dir=tmp_path / "plan")) == "the plan"
        assert sys.modules["edge_builder_demo"].CALLS == [("tv_box", "plan")]
    finally:
        sys.modules.pop("edge_builder_demo", None)
        monkeypatch.undo()
    assert "tv_box" not in builder_names()
