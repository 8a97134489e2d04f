"""What a failed rknn-toolkit2 stage raises."""

from __future__ import annotations

from pathlib import Path

from ...errors import EdgeError


class RknnBuildError(EdgeError):
    """A toolkit stage returned non-zero or raised; ``stage`` names it and ``log_path`` holds its output."""

    def __init__(self, stage: str, detail: str, log_path: Path | None):
        self.stage, self.log_path = stage, log_path
        where = f"; the toolkit's log is {log_path}" if log_path else ""
        super().__init__(f"rknn-toolkit2 {stage} failed: {detail}{where}")
