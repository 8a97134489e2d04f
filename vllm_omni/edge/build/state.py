"""Resumable builds: what a build has finished, recorded beside its outputs, and the tools it used.

A build directory holds a small JSON state file (``.export-state.json``, ``.build-state.json``)
with a *fingerprint* of the inputs (checkpoint sha256, backend, ...) and one record per finished
output (its file, size and sha256, written after the output). A re-run with the same fingerprint
keeps every output whose file still matches its record; a different fingerprint starts afresh.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ..files import file_matches, write_json_atomically


class BuildState:
    """The records of one build directory under ``section`` (``programs``, ``steps``), for one fingerprint."""

    def __init__(self, path: Path, fingerprint: dict[str, Any], section: str):
        self.path, self.fingerprint, self.section = path, fingerprint, section
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        self.records: dict[str, Any] = saved.get(section, {}) if saved.get("fingerprint") == fingerprint else {}

    def intact(self, key: str, file_of: Callable[[dict[str, Any]], Path]) -> dict[str, Any] | None:
        """The record of ``key`` when the file it names (``file_of(record)``) still has its size and sha256."""
        record = self.records.get(key)
        if record is None or not file_matches(file_of(record), record.get("size_bytes"), record.get("sha256")):
            return None
        return record

    def record(self, key: str, record: dict[str, Any]) -> None:
        """Remember ``key`` as finished (atomically: a crash leaves the previous state)."""
        self.records[key] = record
        write_json_atomically(self.path, {"fingerprint": self.fingerprint, self.section: self.records})


def tool_versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` (those not installed are left out): what a build record notes."""
    versions = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions
