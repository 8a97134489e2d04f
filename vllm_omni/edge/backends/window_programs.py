"""What the windowed backends share (no torch): a backend made of a program writer and a runner, and
the check every runner makes on load, that the program describes itself as its contract says.

A ``.pte`` answers through constant methods, a ``.pt2`` through an extra file; a program from
another export is refused here instead of decoding the wrong audio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..graphs.window_contract import WindowContract
from ..plan.manifest import ManifestError
from ..plan.model import ExecPlan
from .interface import RunnerOptions


def check_program_metadata(contract: WindowContract, metadata: Mapping[str, int], path: Path) -> None:
    """Raise :class:`ManifestError` naming each field where ``metadata`` differs from ``contract``."""
    wrong = contract.metadata_mismatches(metadata)
    if wrong:
        details = ", ".join(f"{key}: expected {want}, program says {have}" for key, (want, have) in wrong.items())
        raise ManifestError(f"{path} does not describe itself as expected ({details}); re-export")


@dataclass(frozen=True)
class WindowProgramBackend:
    """A windowed backend: ``writer(partitioner)`` lowers programs, ``runner(path, contract)`` runs one."""

    name: str
    default_partitioner: str
    writer: type
    runner: type
    graph_kind: str = "windowed"

    def program_writer(self, partitioner: str) -> Any:
        return self.writer(partitioner)

    def open_window_runner(self, path: Path, contract: WindowContract, method: str | None = None) -> Any:
        """The program at ``path`` (``method`` of it, for backends whose files hold several windows)."""
        if method is not None:
            raise ManifestError(
                f"{path}: the {self.name} backend holds one window per file; it has no method {method!r}"
            )
        return self.runner(path, contract)

    def open_runner(self, plan: ExecPlan, role: str, options: RunnerOptions) -> Any:
        """The program of window ``role`` (e.g. ``window_c72_n25``) in ``plan``, with the plan's contract."""
        window = {window.name: window for window in plan.schedule}[role]
        return self.open_window_runner(plan.path(role), WindowContract(window, plan.codec))
