"""The hardware-class registry: built-in classes, plugins by entry point, detection."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_omni.edge.cli.main import main as edge_main
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import (
    ENTRY_POINT_GROUP,
    UnknownHardwareClassError,
    detect,
    get_hardware_class,
    hardware_classes,
)

from ..plugin_package import install_plugin


def test_builtin_classes_say_what_they_decode_with():
    classes = hardware_classes()
    assert {"npu_phone", "rockchip_npu", "cpu_x86_64", "cpu_arm64", "browser"} <= set(classes)
    phone, rockchip = classes["npu_phone"], classes["rockchip_npu"]
    assert (phone.graph_kind, phone.backend, phone.defaults["ramp"], phone.defaults["context_frames"]) == (
        "windowed",
        "executorch",
        (2, 4, 8, 16, 25),
        72,
    )
    assert (rockchip.graph_kind, rockchip.backend, rockchip.dtype, rockchip.default_target) == (
        "stateful",
        "rknn",
        "fp16",
        "rk3588",
    )
    assert "rk3576" in rockchip.targets
    assert classes["cpu_arm64"].backend == classes["cpu_x86_64"].backend == "onnxruntime"
    # The page runs the CPU classes' builder in the webgpu layout in onnxruntime-web; Python checks and decodes the
    # same plan.
    browser, cpu = classes["browser"], classes["cpu_x86_64"]
    assert (browser.graph_kind, browser.backend, browser.builder, browser.defaults) == (
        cpu.graph_kind,
        cpu.backend,
        cpu.builder,
        {"first_step_frames": 2, "step_frames": 16, "graph_layout": "webgpu", "external_data": True},
    )
    assert "onnxruntime-web" in browser.description and "Web Worker" in browser.description
    # Builders by name (vllm_omni.edge.builders.registry resolves them; tests/edge/builders/test_registry.py).
    assert [(kind, phone.builder_for(kind)) for kind in phone.graph_kinds] == [
        ("windowed", "windowed"),
        ("stateful", "executorch"),
    ]
    assert (rockchip.builder_for(), cpu.builder_for()) == ("rknn", "onnx")
    with pytest.raises(EdgeError, match="class 'rockchip_npu' builds stateful graphs, not 'windowed'"):
        rockchip.builder_for("windowed")


def test_an_unknown_class_lists_the_known_ones(capsys):
    with pytest.raises(UnknownHardwareClassError, match="unknown hardware class 'gpu_phone'; known: npu_phone"):
        get_hardware_class("gpu_phone")
    assert edge_main(["build", "--hardware", "gpu_phone", "--model", "x", "--out", "y"]) == 1
    assert "known: npu_phone, rockchip_npu, cpu_x86_64, cpu_arm64, browser" in capsys.readouterr().err


def test_a_class_from_another_package_registers_through_the_entry_point_group(tmp_path, monkeypatch):
    install_plugin(
        tmp_path,
        monkeypatch,
        "edge_plugin_demo",
        (
            "from vllm_omni.edge.hardware import HardwareClass\n"
            "TV_BOX = HardwareClass(name='tv_box', description='a TV box CPU', graph_kind='stateful',\n"
            "    backend='onnxruntime', dtype='fp32', builder='onnx',\n"
            "    defaults={'first_step_frames': 0, 'step_frames': 8})\n"
        ),
        ENTRY_POINT_GROUP,
        "tv_box = edge_plugin_demo:TV_BOX",
    )
    hardware_classes.cache_clear()
    try:
        record = get_hardware_class("tv_box")
        assert record.defaults["step_frames"] == 8 and record.builder_for() == "onnx"
    finally:
        sys.modules.pop("edge_plugin_demo", None)
        monkeypatch.undo()
        hardware_classes.cache_clear()
    assert "tv_box" not in hardware_classes()


def test_detect_reads_the_device_tree_the_platform_and_the_override(tmp_path):
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"radxa,rock-5b\0rockchip,rk3588\0")
    found = detect(environ={}, compatible=compatible, machine="aarch64")
    assert (found.hardware_class, found.target) == ("rockchip_npu", "rk3588")
    missing = tmp_path / "none"
    assert detect(environ={}, compatible=missing, machine="aarch64").hardware_class == "cpu_arm64"
    assert detect(environ={}, compatible=missing, machine="x86_64").hardware_class == "cpu_x86_64"
    assert detect(environ={"ANDROID_ROOT": "/system"}, compatible=missing).hardware_class == "npu_phone"
    for machine in ("x86_64", "aarch64", "riscv64"):  # a page asks for the browser plan; a machine never is one
        assert detect(environ={}, compatible=missing, machine=machine).hardware_class != "browser"
    override = detect(environ={"VLLM_OMNI_EDGE_HARDWARE": "npu_phone"}, compatible=compatible)
    assert override.hardware_class == "npu_phone" and "VLLM_OMNI_EDGE_HARDWARE" in override.reason
    with pytest.raises(UnknownHardwareClassError, match="known: npu_phone"):
        detect(environ={"VLLM_OMNI_EDGE_HARDWARE": "toaster"}, compatible=missing)


def test_hardware_list_and_detect_on_the_command_line(capsys, monkeypatch):
    assert edge_main(["hardware", "list"]) == 0
    listed = capsys.readouterr().out
    assert "rockchip_npu" in listed and "rk3588" in listed
    rockchip = listed[listed.index("rockchip_npu") : listed.index("cpu_x86_64")]
    assert "build: reports the op placement" in rockchip and "--allow-cpu-ops" in rockchip
    assert listed.count("build: ") == 1  # the other classes have no build note
    monkeypatch.setenv("VLLM_OMNI_EDGE_HARDWARE", "cpu_arm64")
    assert edge_main(["hardware", "detect"]) == 0
    assert capsys.readouterr().out.startswith("cpu_arm64: set by VLLM_OMNI_EDGE_HARDWARE")


def test_a_target_for_a_class_without_targets_is_a_usage_error(capsys):
    command = ["build", "--hardware", "cpu_x86_64", "--model", "x", "--out", str(Path("y")), "--target", "a"]
    assert edge_main(command) == 2
    assert "not compiled per SoC" in capsys.readouterr().err
