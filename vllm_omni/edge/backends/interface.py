"""What a backend is: the protocols every backend implements, and what the runtime hands it.

A backend exports an artifact and opens a runner for it on a device (:class:`Backend`,
:meth:`Backend.open_runner`); what the runner is depends on the backend's ``graph_kind``:

- **windowed**: a :class:`WindowRunner` (``int64[1, Q, window]`` -> ``float32[chunk * samples_per_frame]``).
  These backends also export: :meth:`WindowBackend.program_writer` lowers a ``torch.export``
  program of one window to a file, and :meth:`WindowBackend.open_window_runner` runs a file
  outside a plan (a bare export's ``manifest.json``).
- **stateful**: a :class:`StepRunner` (contract: :mod:`..graphs.step_contract`). Step graphs are
  exported to ONNX by :mod:`.onnx` and compiled further by the backend's own converter where it
  has one (:mod:`.rknn`, in the converter venv), or lowered to one multi-method ``.pte`` by
  :mod:`.executorch`, so their export is not a method here.

A backend that runs both kinds (executorch) says so in ``graph_kinds``; :func:`graph_kinds` reads it.
Backend modules import this module, never :mod:`.registry` (which imports them), so no import runs in a
circle; like the registry, it is free of torch.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EdgeExportError

if TYPE_CHECKING:
    import numpy as np

    from ..graphs.step_contract import StepContract
    from ..graphs.window_contract import Window, WindowContract
    from ..plan.model import ExecPlan


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


def graph_kinds(backend: Backend) -> tuple[str, ...]:
    """The graph kinds ``backend`` runs: its ``graph_kinds`` when it has several, else its ``graph_kind``."""
    return tuple(getattr(backend, "graph_kinds", (backend.graph_kind,)))
