"""``.pt2`` files: the ``torch.export`` program itself, always available (torch is a requirement).

The window's metadata travels in the archive as the extra file ``qwen3_tts_window.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..files import write_atomically
from .programs import BackendUnavailableError

METADATA_FILE = "qwen3_tts_window.json"


class TorchExportBackend:
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
        write_atomically(path, lambda temporary: torch.export.save(exported, str(temporary), extra_files=extra_files))
        return None


def load_pt2(path: str | os.PathLike[str]) -> tuple[Any, dict[str, int]]:
    """``(ExportedProgram, metadata)`` of a ``.pt2`` written by :class:`TorchExportBackend`."""
    import torch

    extra = {METADATA_FILE: ""}
    exported = torch.export.load(str(path), extra_files=extra)
    return exported, json.loads(extra[METADATA_FILE]) if extra[METADATA_FILE] else {}
