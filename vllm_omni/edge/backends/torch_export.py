"""``.pt2`` files: the ``torch.export`` program itself, written and run by torch.

The window's metadata travels in the archive as the extra file ``qwen3_tts_window.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..files import write_atomically
from ..graphs.window_contract import WindowContract
from .interface import BackendUnavailableError
from .window_programs import WindowProgramBackend, check_program_metadata

METADATA_FILE = "qwen3_tts_window.json"
# torch 2.13's own pytree use warns once per program exported, saved or loaded; nothing a user can act on.
PYTREE_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def quiet_torch_export() -> Iterator[None]:
    """Silence torch.export's own pytree FutureWarning inside this block only (not globally)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYTREE_DEPRECATION, category=FutureWarning)
        yield


class TorchExportProgramWriter:
    name = "torch_export"
    suffix = ".pt2"

    def __init__(self, partitioner: str = "none"):
        if partitioner != "none":
            raise BackendUnavailableError(
                f"--partitioner {partitioner} applies to --backend executorch; torch_export writes the exported "
                "program as it is (use --partitioner none or leave it out)"
            )
        self.partitioner = partitioner

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> None:
        import torch

        extra_files = {METADATA_FILE: json.dumps(metadata)}
        with quiet_torch_export():
            write_atomically(
                path, lambda temporary: torch.export.save(exported, str(temporary), extra_files=extra_files)
            )
        return None


def load_pt2(path: str | os.PathLike[str]) -> tuple[Any, dict[str, int]]:
    """``(ExportedProgram, metadata)`` of a ``.pt2`` written by :class:`TorchExportProgramWriter`."""
    import torch

    extra = {METADATA_FILE: ""}
    with quiet_torch_export():
        exported = torch.export.load(str(path), extra_files=extra)
    return exported, json.loads(extra[METADATA_FILE]) if extra[METADATA_FILE] else {}


class TorchExportWindowRunner:
    """A ``.pt2`` window run by torch (``torch.export.load(...).module()``)."""

    def __init__(self, path: str | os.PathLike[str], contract: WindowContract):
        import torch

        self._torch = torch
        self.window = contract.window
        self.path = Path(path)
        exported, metadata = load_pt2(self.path)
        check_program_metadata(contract, metadata, self.path)
        self._module = exported.module()

    def run(self, codes: np.ndarray) -> np.ndarray:
        with self._torch.no_grad():
            audio = self._module(self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)))
        return audio.numpy().ravel()


# Windowed programs as ``.pt2`` archives: for debugging and for hosts that run torch.
BACKEND = WindowProgramBackend("torch_export", "none", TorchExportProgramWriter, TorchExportWindowRunner)
