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
            builder = get_builder(record.builder_for(kind))
            named[(record.name, kind)] = f"{builder.__module__}.{builder.__name__}"
    root = "vllm_omni.edge.builders"
    assert named == {
        ("npu_phone", "windowed"): f"{root}.windowed.build",
        ("npu_phone", "stateful"): f"{root}.executorch.build.build",
        ("rockchip_npu", "stateful"): f"{root}.rknn.build.build",
        ("cpu_x86_64", "stateful"): f"{root}.onnx.build.build",
        ("cpu_arm64", "stateful"): f"{root}.onnx.build.build",
        ("browser", "stateful"): f"{root}.onnx.build.build",
    }
    assert {f"{b.__module__}.{b.__name__}" for b in BUILTIN_BUILDERS.values()} == set(named.values())


def test_a_builders_name_is_its_module_under_the_builders_package():
    for name, builder in BUILTIN_BUILDERS.items():
        assert builder.__module__.split(".")[3] == name, (name, builder.__module__)


def test_an_unknown_builder_names_the_known_ones_before_any_work(tmp_path):
    with pytest.raises(UnknownBuilderError, match="unknown builder 'tflite'; known: windowed, onnx, "):
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
