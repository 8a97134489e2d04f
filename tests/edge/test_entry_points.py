"""One plugin loader and one failure policy for every registry (hardware classes, backends, builders)."""

from __future__ import annotations

import logging

import pytest

from vllm_omni.edge.backends import registry as backends
from vllm_omni.edge.builders import registry as builders
from vllm_omni.edge.hardware import registry as hardware

from .plugin_package import install_plugin

REGISTRIES = {
    "hardware class": (hardware.ENTRY_POINT_GROUP, hardware.get_hardware_class, hardware.UnknownHardwareClassError),
    "backend": (backends.ENTRY_POINT_GROUP, backends.get_backend, backends.BackendUnavailableError),
    "builder": (builders.ENTRY_POINT_GROUP, builders.get_builder, builders.UnknownBuilderError),
}


@pytest.fixture
def fresh_registries():
    hardware.hardware_classes.cache_clear()
    backends.backend_names.cache_clear()
    yield
    hardware.hardware_classes.cache_clear()
    backends.backend_names.cache_clear()


@pytest.mark.parametrize("kind", REGISTRIES)
def test_a_broken_plugin_is_listed_refused_by_name_and_hides_nothing(
    kind, tmp_path, monkeypatch, caplog, fresh_registries
):
    group, get, error = REGISTRIES[kind]
    install_plugin(tmp_path, monkeypatch, "edge_broken_plugin", "raise ImportError('no such SDK')\n", group,
                   "broken = edge_broken_plugin:THING")  # fmt: skip
    plugins = {"hardware class": hardware.PLUGINS, "backend": backends.PLUGINS, "builder": builders.PLUGINS}[kind]
    assert plugins.names()[-1] == "broken"  # listed by name without importing it
    with pytest.raises(error, match=f"{kind} plugin 'broken' failed to load: no such SDK"):
        get("broken")
    with caplog.at_level(logging.WARNING, logger="vllm_omni.edge.entry_points"):
        assert plugins.load_all() == {}  # listing what plugins give skips it, saying why
    assert f"{kind} plugin 'broken' failed to load" in caplog.text
    if kind == "hardware class":
        assert "browser" in hardware.hardware_classes() and "broken" not in hardware.hardware_classes()
    if kind == "backend":
        assert backends.windowed_backend_names() == ["torch_export", "executorch"]


@pytest.mark.parametrize("kind", REGISTRIES)
def test_a_plugin_named_as_a_built_in_is_ignored_with_a_warning(kind, tmp_path, monkeypatch, caplog, fresh_registries):
    group, get, _error = REGISTRIES[kind]
    builtin = {"hardware class": "browser", "backend": "onnxruntime", "builder": "onnx"}[kind]
    install_plugin(tmp_path, monkeypatch, "edge_shadow_plugin", "THING = object()\n", group,
                   f"{builtin} = edge_shadow_plugin:THING")  # fmt: skip
    plugins = {"hardware class": hardware.PLUGINS, "backend": backends.PLUGINS, "builder": builders.PLUGINS}[kind]
    with caplog.at_level(logging.WARNING, logger="vllm_omni.edge.entry_points"):
        assert plugins.names().count(builtin) == 1 and plugins.load_all() == {}
    assert f"{kind} plugin {builtin!r} is shadowed by the built-in {kind} of that name" in caplog.text
    assert type(get(builtin)) is not object  # the built-in answers


def test_a_hardware_class_plugin_must_be_named_as_its_entry_point(tmp_path, monkeypatch, fresh_registries):
    source = (
        "from vllm_omni.edge.hardware import HardwareClass\n"
        "BOX = HardwareClass(name='set_top', description='a box', graph_kind='stateful', backend='onnxruntime',\n"
        "    dtype='fp32', builder='onnx')\n"
    )
    install_plugin(tmp_path, monkeypatch, "edge_misnamed_plugin", source, hardware.ENTRY_POINT_GROUP,
                   "tv_box = edge_misnamed_plugin:BOX")  # fmt: skip
    with pytest.raises(hardware.UnknownHardwareClassError, match="gave a class named 'set_top'"):
        hardware.get_hardware_class("tv_box")
