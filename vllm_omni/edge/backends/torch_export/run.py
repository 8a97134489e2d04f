"""Run a ``.pt2`` window in torch (:class:`TorchExportWindowRunner`), checking its metadata against the contract."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...graphs.window_contract import WindowContract
from ..window_programs import WindowProgramBackend, check_program_metadata
from .export import METADATA_FILE, TorchExportProgramWriter, quiet_torch_export


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
