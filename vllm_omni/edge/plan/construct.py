"""Making plans from what a build produced: step graphs, or the manifest of windowed programs (no torch).

Each constructor records every file's size and sha256 (relative to the plan directory) and checks
the new plan against its schema and contracts before returning it; writing is the caller's step.
The windowed manifest (:mod:`.manifest`) and the plan describe the same programs: the plan is made
from the manifest here, and nowhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import file_sha256
from ..graphs.step_contract import StepContract
from ..graphs.window_contract import WindowContract
from .artifact import PlanArtifact
from .manifest import MANIFEST_NAME, WindowedManifest
from .model import DEFAULT_DEVICE_DIR, ExecPlan
from .schema import ExecPlanError, check_schema
from .validation import check_contracts


def file_record(path: str | os.PathLike[str], relative_to: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"file", "sha256", "size_bytes"}`` of ``path``, its name relative to the plan directory."""
    path = Path(path)
    return {
        "file": path.relative_to(relative_to).as_posix(),
        "sha256": file_sha256(path),
        "size_bytes": path.stat().st_size,
    }


@dataclass(frozen=True)
class StepArtifact:
    """A built step graph on its way into a plan: the file, its contract, how it was checked, its ONNX source,
    and the method that is this step when the file is a multi-method program shared by several steps."""

    path: Path
    contract: StepContract
    verification: dict[str, Any] | None = None
    source: Path | None = None
    method: str | None = None
    external_data: Path | None = None  # the graph's ONNX external data file (its weights)


def stateful_plan(
    *,
    hardware_class: str,
    backend: str,
    dtype: str,
    model: dict[str, Any],
    directory: str | os.PathLike[str],
    steps: dict[str, StepArtifact],
    target: str | None = None,
    device_dir: str = DEFAULT_DEVICE_DIR,
    build: dict[str, Any] | None = None,
) -> ExecPlan:
    """A plan over step artifacts (``main`` and optionally ``first``) in ``directory``; checked before it returns."""
    directory = Path(directory)
    if "main" not in steps:
        raise ExecPlanError(f"a stateful plan needs a 'main' step, found roles {sorted(steps)}")
    main = steps["main"].contract
    records: dict[Path, dict[str, Any]] = {}  # a file shared by several steps is hashed once

    def record(path: Path) -> dict[str, Any]:
        if path not in records:
            records[path] = file_record(path, directory)
        return records[path]

    artifacts = {
        role: PlanArtifact(
            role=role,
            **record(step.path),
            contract=step.contract.to_json(),
            source=record(step.source) if step.source is not None else None,
            external_data=record(step.external_data) if step.external_data is not None else None,
            verification=step.verification,
            method=step.method,
        )
        for role, step in steps.items()
    }
    plan = ExecPlan(
        hardware_class=hardware_class,
        graph_kind="stateful",
        backend=backend,
        dtype=dtype,
        model={"geometry": main.geometry, **model},
        codec=main.codec,
        artifacts=artifacts,
        target=target,
        device_dir=device_dir,
        build=build or {},
        directory=directory,
    )
    check_schema(plan.to_json(), "new plan")
    check_contracts(plan, "new plan")
    return plan


def _delegation(manifest: WindowedManifest) -> dict[str, Any]:
    """``{"delegation": {method: report}}`` of the programs whose lowering reported it, else nothing."""
    reports = {
        entry.method or entry.window.name: entry.ops["delegation"]
        for entry in manifest.programs
        if isinstance(entry.ops, dict) and isinstance(entry.ops.get("delegation"), dict)
    }
    return {"delegation": reports} if reports else {}


def windowed_plan(manifest: WindowedManifest, *, hardware_class: str, device_dir: str = DEFAULT_DEVICE_DIR) -> ExecPlan:
    """The plan of the windowed programs ``manifest`` describes (in the manifest's directory).

    The manifest already holds each program's size and sha256, computed when it was written or
    verified, so nothing is hashed again here.
    """
    if manifest.directory is None:
        raise ExecPlanError("a windowed plan is made from a manifest read from (or written to) its directory")
    artifacts = {
        entry.window.name: PlanArtifact(
            role=entry.window.name,
            file=entry.path,
            sha256=entry.sha256,
            size_bytes=entry.size_bytes,
            contract=WindowContract(entry.window, manifest.codec).to_json(),
            verification=entry.check,
            method=entry.method,
        )
        for entry in manifest.programs
    }
    plan = ExecPlan(
        hardware_class=hardware_class,
        graph_kind="windowed",
        backend=manifest.backend,
        dtype=manifest.dtype,
        model={"id": manifest.model_id, "checkpoint_sha256": manifest.checkpoint_sha256, "geometry": manifest.geometry},
        codec=manifest.codec,
        artifacts=artifacts,
        windowed={
            "ramp": list(manifest.ramp),
            "context_frames": manifest.context_frames,
            "partitioner": manifest.partitioner,
        },
        device_dir=device_dir,
        build={"tools": manifest.tools, "manifest": MANIFEST_NAME, **_delegation(manifest)},
        directory=manifest.directory,
    )
    check_schema(plan.to_json(), "new plan")
    check_contracts(plan, "new plan")
    return plan
