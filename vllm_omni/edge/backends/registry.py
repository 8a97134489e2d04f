"""The backend registry: a backend exports an artifact and opens a runner for it on a device.

A backend is looked up by the name a plan or a command line gives (``--backend``, ``plan.backend``)
as a lazily imported ``"module:attribute"`` (a backend class or instance), so choosing one never
imports another's toolchain, and this module (and every backend module at import time) is free
of torch: device runtimes use it.
Packages add backends through the ``vllm_omni.edge.backends`` entry-point group, each entry
point resolving to a backend class (instantiated without arguments) or instance; with it, a
hardware class from a plugin can bring its own runtime.

Every backend opens the runner of one artifact of a plan, :meth:`Backend.open_runner`; what the
runner is depends on the backend's ``graph_kind``:

- **windowed**: a :class:`WindowRunner` (``int64[1, Q, window]`` -> ``float32[chunk * samples_per_frame]``).
  These backends also export: :meth:`WindowBackend.program_writer` lowers a ``torch.export``
  program of one window to a file, and :meth:`WindowBackend.open_window_runner` runs a file
  outside a plan (a bare export's ``manifest.json``).
- **stateful**: a :class:`StepRunner` (contract: :mod:`..graphs.step_contract`). Step graphs are
  exported to ONNX by :mod:`.onnx` and compiled further by the backend's own converter where it
  has one (:mod:`.rknn`, in the converter venv), or lowered to one multi-method ``.pte`` by
  :mod:`.executorch`, so their export is not a method here.

A backend that runs both kinds (executorch) says so in ``graph_kinds``; :func:`graph_kinds` reads it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EdgeExportError

if TYPE_CHECKING:
    import numpy as np

    from ..graphs.step_contract import StepContract
    from ..graphs.window_contract import Window, WindowContract
    from ..plan.model import ExecPlan

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_omni.edge.backends"
BUILTIN_BACKENDS = {
    "torch_export": "vllm_omni.edge.backends.torch_export:BACKEND",
    "executorch": "vllm_omni.edge.backends.executorch:BACKEND",
    "onnxruntime": "vllm_omni.edge.backends.onnxruntime:OnnxRuntimeBackend",
    "rknn": "vllm_omni.edge.backends.rknn_runtime:RknnBackend",
}


class BackendUnavailableError(EdgeExportError):
    """A backend or partitioner was asked for whose toolchain is not installed here, or that nobody registered."""


@dataclass(frozen=True)
class RunnerOptions:
    """How a device runs artifacts.

    ``threads``: onnxruntime intra-op threads; ExecuTorch's thread pool (process-wide).
    ``rknn_runtime``: ``board``, ``simulator`` or ``auto``.
    ``prepack``: let onnxruntime repack the MatMul weights at open: about 8% faster steps at the
    released geometry, for about 0.4 s more per open (a long-lived server; devices want first audio).
    """

    threads: int | None = None
    rknn_runtime: str = "auto"
    prepack: bool = False


class LoadedWhileHeld:
    """What backends load from artifact files (a program, a session), shared while any runner holds it.

    Roles of a plan that name one file (methods of one program, step sizes of one graph) get the
    same loaded object, so the weights are in memory once; when the last runner is gone, so is it.
    """

    def __init__(self) -> None:
        self._loaded: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The object loaded under ``key``, or ``load()``'s result, kept under ``key`` while it is held."""
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is None:
                loaded = load()
                self._loaded[key] = loaded
            return loaded


class StepRunner(Protocol):
    """One stateful step artifact, loaded: ``run(codes, freqs, cache_valid, cache) -> (audio, cache)``."""

    contract: StepContract

    def run(
        self, codes: np.ndarray, freqs: np.ndarray, cache_valid: np.ndarray, cache: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


class WindowRunner(Protocol):
    """One windowed program, loaded: ``int64[1, Q, window_frames]`` -> ``float32[chunk_frames * samples_per_frame]``."""

    window: Window

    def run(self, codes: np.ndarray) -> np.ndarray: ...


class ProgramWriter(Protocol):
    """Lowers one window's ``torch.export`` program to a file (the export side of a windowed backend)."""

    name: str
    partitioner: str
    suffix: str

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> dict[str, int] | None:
        """Lower ``exported`` (a ``torch.export.ExportedProgram``) and write it to ``path``; return op counts."""
        ...


class Backend(Protocol):
    name: str
    graph_kind: str  # "windowed" | "stateful"

    def open_runner(self, plan: ExecPlan, role: str, options: RunnerOptions) -> StepRunner | WindowRunner:
        """Load the artifact of ``role`` in ``plan`` (already validated) for streaming."""
        ...


class WindowBackend(Backend, Protocol):
    default_partitioner: str

    def program_writer(self, partitioner: str) -> ProgramWriter:
        """The writer for ``partitioner``; raises :class:`BackendUnavailableError` before any export work."""
        ...

    def open_window_runner(self, path: Path, contract: WindowContract, method: str | None = None) -> WindowRunner:
        """Load the program at ``path`` (its ``method``, when the file holds several windows) after checking
        that it describes itself as ``contract``."""
        ...


def _entry_point_backends() -> dict[str, str | Any]:
    found: dict[str, str | Any] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in BUILTIN_BACKENDS:
            logger.warning("backend plugin %r is shadowed by the built-in backend of that name", entry_point.name)
            continue
        found[entry_point.name] = entry_point
    return found


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
        module_name, _, attribute = BUILTIN_BACKENDS[name].partition(":")
        value = getattr(importlib.import_module(module_name), attribute)
    else:
        plugins = _entry_point_backends()
        if name not in plugins:
            raise BackendUnavailableError(f"unknown backend {name!r}; known: {', '.join(backend_names())}")
        try:
            value = plugins[name].load()
        except Exception as exc:  # a plugin may fail in any way; say which one
            raise BackendUnavailableError(f"backend plugin {name!r} failed to load: {exc}") from exc
    return value() if isinstance(value, type) else value


def graph_kinds(backend: Backend) -> tuple[str, ...]:
    """The graph kinds ``backend`` runs: its ``graph_kinds`` when it has several, else its ``graph_kind``."""
    return tuple(getattr(backend, "graph_kinds", (backend.graph_kind,)))


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
