"""One file of an execution plan: its role, where it lies (relative to the plan) and what it must be."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlanFile:
    """One file of a plan's directory as the plan records it: ``field`` is where (``artifacts.main`` or
    ``artifacts.main.source``, the prefix of an error about it), then its name relative to the plan, its sha256
    and its size in bytes."""

    field: str
    file: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class PlanArtifact:
    """One file of a plan: its role, where it is (relative to the plan) and what it must be."""

    role: str
    file: str
    sha256: str
    size_bytes: int
    contract: dict[str, Any]
    source: dict[str, Any] | None = None  # the ONNX graph an .rknn was compiled from (file, sha256, size_bytes)
    verification: dict[str, Any] | None = None
    # The method of a multi-method program (ExecuTorch) that is this role; ``None``: the file's only program.
    # Several roles may name one file (one copy of the weights), each through its own method.
    method: str | None = None
    # The ONNX external data file holding the graph's weights (file, sha256, size_bytes), beside the graph under the
    # name the graph records: a runtime hands the weights over without parsing them out of the graph's protobuf.
    external_data: dict[str, Any] | None = None

    def files(self) -> list[PlanFile]:
        """The files this role needs in the plan's directory: its own, its external data, the source graph."""
        records = [PlanFile(f"artifacts.{self.role}", self.file, self.sha256, self.size_bytes)]
        for key in ("external_data", "source"):
            row = getattr(self, key)
            if row is not None:
                records.append(PlanFile(f"artifacts.{self.role}.{key}", row["file"], row["sha256"], row["size_bytes"]))
        return records

    @property
    def content_sha256(self) -> str:
        """What identifies the graph and its weights: its sha256, combined with its external data's where it has
        one (the graph file alone names the data, not its values)."""
        if self.external_data is None:
            return self.sha256
        return hashlib.sha256(f"{self.sha256}:{self.external_data['sha256']}".encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        row = {"file": self.file, "sha256": self.sha256, "size_bytes": self.size_bytes, "contract": self.contract}
        if self.method is not None:  # absent, not null, when unused: older plans keep their plan_id
            row["method"] = self.method
        if self.external_data is not None:
            row["external_data"] = self.external_data
        if self.source is not None:
            row["source"] = self.source
        if self.verification is not None:
            row["verification"] = self.verification
        return row
