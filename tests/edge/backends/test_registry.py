"""The backend registry: built-in backends by name, plugin backends through the entry-point group."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import numpy as np
import pytest

from vllm_omni.edge.backends.interface import BackendUnavailableError
from vllm_omni.edge.backends.registry import (
    BUILTIN_BACKENDS,
    ENTRY_POINT_GROUP,
    backend_names,
    get_backend,
    program_writer,
)
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.edge.runtime import StreamDecoder, open_decoder
from vllm_omni.testing.codes import random_codes

from ..plugin_package import install_plugin


def clear_registry() -> None:
    backend_names.cache_clear()
    get_backend.cache_clear()


def test_every_builtin_backend_resolves_to_its_name_and_graph_kind():
    kinds = {name: get_backend(name).graph_kind for name in BUILTIN_BACKENDS}
    assert kinds == {
        "torch_export": "windowed",
        "executorch": "windowed",
        "onnxruntime": "stateful",
        "rknn": "stateful",
    }
    assert all(get_backend(name).name == name for name in BUILTIN_BACKENDS)


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tflite'; known: torch_export, executorch, "):
        get_backend("tflite")
    with pytest.raises(BackendUnavailableError, match="unknown backend 'onnxruntime'; known: torch_export, executorch"):
        program_writer("onnxruntime")  # a stateful backend writes no windowed programs


LAZY_BACKENDS = """
import sys

TOOLCHAINS = {"torch", "executorch", "onnx", "rknn", "rknnlite"}
BACKENDS = {f"vllm_omni.edge.backends.{name}.run" for name in ("executorch", "torch_export", "onnx", "rknn")}


def loaded(names):
    return sorted(name for name in sys.modules if name in names or name.split(".")[0] in names)


from vllm_omni.edge.backends.registry import get_backend

assert not loaded(TOOLCHAINS | BACKENDS), f"importing the registry loaded {loaded(TOOLCHAINS | BACKENDS)}"
assert get_backend("onnxruntime").graph_kind == get_backend("rknn").graph_kind == "stateful"
heavy = TOOLCHAINS | {
    f"vllm_omni.edge.backends.{name}"
    for name in ("executorch.run", "executorch.export", "torch_export.run", "torch_export.export", "rknn.convert")
}
assert not loaded(heavy), f"the device backends loaded {loaded(heavy)}"
assert get_backend("executorch").graph_kind == get_backend("torch_export").graph_kind == "windowed"
assert not loaded(TOOLCHAINS), f"choosing the windowed backends loaded {loaded(TOOLCHAINS)}"
"""


def test_the_registry_imports_a_backend_when_asked_and_its_toolchain_only_when_it_runs(repo_root):
    result = subprocess.run([sys.executable, "-c", LAZY_BACKENDS], cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_plugin_backend_decodes_a_plan_that_names_it(cpu_plan, tmp_path, monkeypatch):
    install_plugin(
        tmp_path,
        monkeypatch,
        "edge_backend_demo",
        (
            "from vllm_omni.edge.backends.onnx.run import OnnxRuntimeBackend\n"
            "class CountingBackend(OnnxRuntimeBackend):\n"
            "    name = 'counting_ort'\n"
            "    opened = []\n"
            "    def open_runner(self, plan, role, options):\n"
            "        self.opened.append(role)\n"
            "        return super().open_runner(plan, role, options)\n"
        ),
        ENTRY_POINT_GROUP,
        "counting_ort = edge_backend_demo:CountingBackend",
    )
    plan = ExecPlan.load(cpu_plan)
    copy = shutil.copytree(cpu_plan, tmp_path / "plan")
    dataclasses.replace(plan, backend="counting_ort", directory=copy).write()
    frames = random_codes(9, seed=3)[0].T.numpy()
    reference = open_decoder(plan)
    expected = np.concatenate([reference.feed(frames), reference.flush()])

    clear_registry()
    try:
        assert "counting_ort" in backend_names()
        decoder = open_decoder(copy)
        assert isinstance(decoder, StreamDecoder)
        assert sorted(get_backend("counting_ort").opened) == ["first", "main"]
        assert np.array_equal(np.concatenate([decoder.feed(frames), decoder.flush()]), expected)
    finally:
        sys.modules.pop("edge_backend_demo", None)
        monkeypatch.undo()
        clear_registry()
    with pytest.raises(ExecPlanError, match="no decoder runtime for backend 'counting_ort'"):
        open_decoder(copy)
