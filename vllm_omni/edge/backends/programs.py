"""Registry of the backends that turn a windowed ``torch.export`` program into a file.

A backend is named on the command line (``--backend torch_export|executorch``) and looked up here
as a lazily imported ``"module:Class"``, so choosing one never imports another's toolchain. Each
backend writes its file through a temporary name and a rename, and returns what it knows about
the result (op counts for ExecuTorch).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from ..errors import EdgeExportError

PROGRAM_BACKENDS = {
    "torch_export": "vllm_omni.edge.backends.torch_export:TorchExportBackend",
    "executorch": "vllm_omni.edge.backends.executorch:ExecuTorchBackend",
}
DEFAULT_PARTITIONER = {"torch_export": "none", "executorch": "xnnpack"}


class BackendUnavailableError(EdgeExportError):
    """A backend or partitioner was asked for whose toolchain is not installed here."""


class ProgramBackend(Protocol):
    name: str
    partitioner: str
    suffix: str

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> dict[str, int] | None:
        """Lower ``exported`` (a ``torch.export.ExportedProgram``) and write it to ``path``; return op counts."""
        ...


def program_backend(name: str, partitioner: str | None = None) -> ProgramBackend:
    """The backend called ``name`` with ``partitioner`` (its default when ``None``).

    Raises :class:`BackendUnavailableError` for an unknown name or a toolchain that is missing,
    before any export work starts.
    """
    if name not in PROGRAM_BACKENDS:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {', '.join(PROGRAM_BACKENDS)}")
    module_name, _, class_name = PROGRAM_BACKENDS[name].partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(partitioner or DEFAULT_PARTITIONER[name])
