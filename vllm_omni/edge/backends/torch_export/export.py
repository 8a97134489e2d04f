"""Write a window's ``torch.export`` program to a ``.pt2`` with its metadata (:class:`TorchExportProgramWriter`)."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...files import write_atomically
from ..interface import BackendUnavailableError

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
