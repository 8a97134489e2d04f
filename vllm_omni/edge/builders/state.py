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

from ..files import file_matches, read_bounded, write_json_atomically

STATE_NAME = ".build-state.json"  # the state file of a stateful build (the windowed export keeps its own name)


class BuildState:
    """The records of one build directory under ``section`` (``programs``, ``steps``), for one fingerprint."""

    def __init__(self, path: Path, fingerprint: dict[str, Any], section: str):
        self.path, self.fingerprint, self.section = path, fingerprint, section
        try:
            saved = json.loads(read_bounded(path))
        except (OSError, RecursionError, ValueError):  # missing, unreadable, not UTF-8, not JSON, too deep
            saved = {}
        # Damaged state (a list, a string record, a foreign file) is no state: those outputs are rebuilt.
        if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
            saved = {}
        records = saved.get(section, {})
        self.records: dict[str, Any] = (
            {key: row for key, row in records.items() if isinstance(row, dict)} if isinstance(records, dict) else {}
        )

    def intact(self, key: str, file_of: Callable[[dict[str, Any]], Path]) -> dict[str, Any] | None:
        """The record of ``key`` when the file it names (``file_of(record)``) still has its size and sha256.

        A record that names no file, or one outside the state's directory, is not intact.
        """
        record = self.records.get(key)
        if record is None:
            return None
        try:
            path = Path(file_of(record))
        except (KeyError, TypeError, ValueError):
            return None
        if path.is_symlink() or path.resolve().parent != self.path.resolve().parent:
            return None
        if not file_matches(path, record.get("size_bytes"), record.get("sha256")):
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
