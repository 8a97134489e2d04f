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
from importlib import metadata

from ..entry_points import load_plugin, plugin_entry_points
from .interface import Backend, BackendUnavailableError, ProgramWriter, graph_kinds

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_omni.edge.backends"


def _torch_export() -> Backend:
    from .torch_export import BACKEND

    return BACKEND


def _executorch() -> Backend:
    from .executorch import BACKEND

    return BACKEND


def _onnxruntime() -> type[Backend]:
    from .onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend


def _rknn() -> type[Backend]:
    from .rknn_runtime import RknnBackend

    return RknnBackend


# name -> loader of the backend (a class, instantiated without arguments, or an instance), imported when asked for.
BUILTIN_BACKENDS: dict[str, Callable[[], Backend | type[Backend]]] = {
    "torch_export": _torch_export,
    "executorch": _executorch,
    "onnxruntime": _onnxruntime,
    "rknn": _rknn,
}


def _entry_point_backends() -> dict[str, metadata.EntryPoint]:
    return plugin_entry_points(ENTRY_POINT_GROUP, BUILTIN_BACKENDS, "backend")


@cache
def backend_names() -> tuple[str, ...]:
    """Every known backend: the built-in ones, then those registered by entry points."""
    return (*BUILTIN_BACKENDS, *_entry_point_backends())


@cache
def get_backend(name: str) -> Backend:
    """The backend called ``name`` (imported now, its toolchain not yet).

    Raises :class:`BackendUnavailableError` naming the known backends for an unknown name.
    """
    if name in BUILTIN_BACKENDS:
        value = BUILTIN_BACKENDS[name]()
    else:
        value = load_plugin(_entry_point_backends(), name, "backend", backend_names(), BackendUnavailableError)
    return value() if isinstance(value, type) else value


def program_writer(name: str, partitioner: str | None = None) -> ProgramWriter:
    """The program writer of windowed backend ``name`` with ``partitioner`` (its default when ``None``)."""
    known = windowed_backend_names()
    if name not in known:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {', '.join(known)}")
    backend = get_backend(name)
    return backend.program_writer(partitioner or backend.default_partitioner)


def windowed_backend_names() -> list[str]:
    """The backends that export windowed programs (``--backend`` of the windowed export)."""
    return [name for name in backend_names() if "windowed" in graph_kinds(get_backend(name))]
