"""The backend registry: a backend by the name a plan or a command line gives (``--backend``, ``plan.backend``).

What a backend is (the protocols, :class:`~.interface.RunnerOptions`) is :mod:`.interface`. The built-in
backends are imported here inside a function per backend, so choosing one never imports another's
toolchain and importing this module imports none of them; the imports are plain statements, so
``lint-imports`` sees each one (``pyproject.toml`` names the three that reach torch or a toolchain as the
exceptions to the device side's contract: a device imports them only for a plan that names them).
This module is free of torch: device runtimes use it.

Packages add backends through the ``vllm_omni.edge.backends`` entry-point group, each entry point
resolving to a backend class (instantiated without arguments) or instance; with it, a hardware class
from a plugin can bring its own runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from ..entry_points import PluginGroup
from .interface import Backend, BackendUnavailableError, ProgramWriter, graph_kinds

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_omni.edge.backends"


def _torch_export() -> Backend:
    from .torch_export.run import BACKEND

    return BACKEND


def _executorch() -> Backend:
    from .executorch.run import BACKEND

    return BACKEND


def _onnxruntime() -> type[Backend]:
    from .onnx.run import OnnxRuntimeBackend

    return OnnxRuntimeBackend


def _rknn() -> type[Backend]:
    from .rknn.run import RknnBackend

    return RknnBackend


# name -> loader of the backend (a class, instantiated without arguments, or an instance), imported when asked for.
BUILTIN_BACKENDS: dict[str, Callable[[], Backend | type[Backend]]] = {
    "torch_export": _torch_export,
    "executorch": _executorch,
    "onnxruntime": _onnxruntime,
    "rknn": _rknn,
}


def _backend(name: str, value: Any) -> Backend:
    """A plugin's backend: its class instantiated without arguments, or the instance it gives."""
    try:
        return value() if isinstance(value, type) else value
    except Exception as exc:  # a plugin's constructor may fail in any way; say which one
        raise BackendUnavailableError(f"backend plugin {name!r} failed to start: {exc}") from exc


PLUGINS = PluginGroup(ENTRY_POINT_GROUP, BUILTIN_BACKENDS, "backend", BackendUnavailableError, _backend)


@cache
def backend_names() -> tuple[str, ...]:
    """Every known backend: the built-in ones, then those registered by entry points."""
    return PLUGINS.names()


@cache
def get_backend(name: str) -> Backend:
    """The backend called ``name`` (imported now, its toolchain not yet).

    Raises :class:`BackendUnavailableError` naming the known backends for an unknown name.
    """
    if name in BUILTIN_BACKENDS:
        value = BUILTIN_BACKENDS[name]()
        return value() if isinstance(value, type) else value
    return PLUGINS.load(name)


def program_writer(name: str, partitioner: str | None = None) -> ProgramWriter:
    """The program writer of windowed backend ``name`` with ``partitioner`` (its default when ``None``)."""
    known = windowed_backend_names()
    if name not in known:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {', '.join(known)}")
    backend = get_backend(name)
    return backend.program_writer(partitioner or backend.default_partitioner)


def windowed_backend_names() -> list[str]:
    """The backends that export windowed programs (``--backend`` of the windowed export); a broken plugin is skipped."""
    backends = {**{name: get_backend(name) for name in BUILTIN_BACKENDS}, **PLUGINS.load_all()}
    return [name for name, backend in backends.items() if "windowed" in graph_kinds(backend)]
