"""What a plan's schema cannot say, checked: contracts against the geometry and each other, files (no torch).

- stateful plans: roles ``main`` and optionally ``first``; each step contract agrees with the plan's
  codec geometry and its own shapes; steps that share a cache share its layout;
- windowed plans: exactly the programs of the ramp's schedule, each with its window contract;
- every artifact (and recorded ONNX source) present in the plan directory with its size and sha256
  (a file already verified and unchanged since is not hashed again: :mod:`..integrity`);
- roles that name one file agree on its size and sha256, and each runs its own part of it: a method
  of a multi-method program (ExecuTorch), or its own step size of one dynamic step graph (onnxruntime);
  each distinct file is checked once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ..files import check_file
from ..geometry import CodecGeometry
from ..graphs.step_contract import StepContract, StepContractError
from ..graphs.window_contract import WindowConfigError, WindowContract, check_ramp, window_schedule
from ..integrity import verified_sha256
from .artifact import PlanArtifact, PlanFile
from .schema import ExecPlanError


class PlanParts(Protocol):
    """What the checks read of a plan (an :class:`~.model.ExecPlan` has it); named here so that the checks
    never import the plan model that calls them."""

    graph_kind: str
    codec: CodecGeometry
    artifacts: Mapping[str, PlanArtifact]
    windowed: dict[str, Any] | None
    directory: Path | None

    def step_contract(self, role: str) -> StepContract: ...


def check_contracts(plan: PlanParts, source: str = "plan") -> None:
    """Contracts against the geometry and each other; windows against the ramp and context; shared files."""
    check_shared_files(plan, source)
    if plan.graph_kind == "stateful":
        _check_steps(plan, source)
    else:
        _check_windows(plan, source)


def _check_steps(plan: PlanParts, source: str) -> None:
    if "main" not in plan.artifacts or set(plan.artifacts) - {"main", "first"}:
        raise ExecPlanError(
            f"{source}: artifacts: a stateful plan has roles 'main' and optionally 'first', found "
            f"{sorted(plan.artifacts)}"
        )
    contracts = {}
    for role in plan.artifacts:
        try:
            contracts[role] = plan.step_contract(role)
        except (StepContractError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ExecPlanError(f"{source}: artifacts.{role}.contract: {exc}") from exc
        contract = contracts[role]
        for name, (have, want) in contract.codec.mismatches(plan.codec).items():
            if have != want:
                raise ExecPlanError(
                    f"{source}: artifacts.{role}.contract: {name} is {have}, the plan's geometry says {want}; "
                    "the artifact comes from another checkpoint: rebuild the plan"
                )
        shapes = plan.artifacts[role].contract
        for key, expected in (("inputs", contract.input_shapes()), ("outputs", contract.output_shapes())):
            if shapes.get(key) != expected:
                raise ExecPlanError(
                    f"{source}: artifacts.{role}.contract.{key}: {shapes.get(key)} does not follow from "
                    f"step_frames={contract.step_frames}, cache_numel={contract.cache_numel} ({expected})"
                )
    if "first" in contracts:
        main, first = contracts["main"], contracts["first"]
        for name in ("cache_numel", "head_dim", "kv_slots"):
            if getattr(first, name) != getattr(main, name):
                raise ExecPlanError(
                    f"{source}: artifacts.first.contract.{name} is {getattr(first, name)} and "
                    f"artifacts.main.contract.{name} is {getattr(main, name)}; steps that share a cache must "
                    "agree: export both from one checkpoint"
                )
        if not first.shares_cache_with(main):
            raise ExecPlanError(
                f"{source}: artifacts.first.contract.cache_layout differs from artifacts.main's; steps that "
                "share a cache must agree: export both from one checkpoint"
            )


def _check_windows(plan: PlanParts, source: str) -> None:
    if plan.windowed is None:
        raise ExecPlanError(f"{source}: windowed: a windowed plan needs its ramp and context_frames")
    try:
        ramp = check_ramp(plan.windowed["ramp"], plan.windowed["context_frames"])
    except WindowConfigError as exc:
        raise ExecPlanError(f"{source}: windowed: {exc}") from exc
    expected = {w.name: w for w in window_schedule(ramp, plan.windowed["context_frames"])}
    if set(plan.artifacts) != set(expected):
        raise ExecPlanError(
            f"{source}: artifacts: the ramp {list(ramp)} with context {plan.windowed['context_frames']} needs "
            f"programs {sorted(expected)}, the plan lists {sorted(plan.artifacts)}"
        )
    for role, window in expected.items():
        want = WindowContract(window, plan.codec).to_json()
        have = plan.artifacts[role].contract
        for key, value in want.items():
            if have.get(key) != value:
                raise ExecPlanError(
                    f"{source}: artifacts.{role}.contract.{key}: {have.get(key)}, but window {role} with "
                    f"{plan.codec.num_quantizers} codebooks and hop {plan.codec.samples_per_frame} needs {value}"
                )


def check_artifacts(plan: PlanParts, source: str = "plan", check_sha256: bool = True) -> None:
    """Every artifact (and recorded source graph) present with the plan's size and sha256."""
    if plan.directory is None:
        raise ExecPlanError(f"{source}: the plan was not read from a directory; nothing to check files against")
    checked: dict[str, PlanFile] = {}  # file -> its first record
    for artifact in plan.artifacts.values():
        for record in artifact.files():
            first = checked.setdefault(record.file, record)
            if first is not record:
                if (first.size_bytes, first.sha256) != (record.size_bytes, record.sha256):
                    raise ExecPlanError(
                        f"{source}: {record.field} and {first.field} name the same file {record.file} with "
                        "different sizes or sha256s; the plan was edited by hand or damaged: rebuild it"
                    )
                continue
            _check_file(plan, source, record.field, record.file, record.size_bytes, record.sha256, check_sha256)


def check_shared_files(plan: PlanParts, source: str = "plan") -> None:
    """Roles naming one file agree on its size and sha256, and each names a method of its own (or, for a
    dynamic step graph, runs it at its own step size: the contracts say which)."""
    first_role: dict[str, str] = {}
    methods: dict[tuple[str, str | None], str] = {}
    for role, artifact in plan.artifacts.items():
        other = first_role.setdefault(artifact.file, role)
        if other != role:
            want = plan.artifacts[other]
            if (artifact.sha256, artifact.size_bytes) != (want.sha256, want.size_bytes):
                raise ExecPlanError(
                    f"{source}: artifacts.{role}: names {artifact.file} like artifacts.{other}, but with sha256 "
                    f"{artifact.sha256[:16]}... and {artifact.size_bytes} bytes against {want.sha256[:16]}... and "
                    f"{want.size_bytes} bytes; one file has one size and hash: rebuild the plan"
                )
        key = (artifact.file, artifact.method)
        dynamic = (
            artifact.method is None and isinstance(artifact.contract, dict) and artifact.contract.get("max_step_frames")
        )
        if not dynamic and methods.setdefault(key, role) != role:  # a dynamic graph runs each role's B
            raise ExecPlanError(
                f"{source}: artifacts.{role} and artifacts.{methods[key]} both name method "
                f"{artifact.method or '(the only one)'} of {artifact.file}; each role of a shared file needs a "
                "method of its own: rebuild the plan"
            )


def _check_file(
    plan: PlanParts, source: str, field_name: str, file: str, size: int, sha256: str, check_sha256: bool
) -> None:
    path = plan.directory / file
    if path.is_symlink() or (path.exists() and plan.directory.resolve() not in path.resolve().parents):
        raise ExecPlanError(
            f"{source}: {field_name}.file: {file} is a link (to {path.resolve()}); a plan holds regular files "
            f"inside its directory {plan.directory}: copy the file in instead of linking it"
        )
    if path.exists() and not path.is_file():
        raise ExecPlanError(f"{source}: {field_name}.file: {file} is not a regular file; rebuild the plan")
    mismatch = check_file(path, size, sha256, check_sha256, sha256_of=verified_sha256)
    if mismatch is None:
        return
    if mismatch.field == "file":
        raise ExecPlanError(
            f"{source}: {field_name}.file: {file} is missing from {plan.directory}; copy the whole plan "
            "directory, or rebuild it"
        )
    if mismatch.field == "size_bytes":
        raise ExecPlanError(
            f"{source}: {field_name}.size_bytes: the plan says {size} bytes, {file} has {mismatch.found}; the file is "
            "truncated or replaced: copy it again or rebuild the plan"
        )
    raise ExecPlanError(
        f"{source}: {field_name}.sha256: the plan says {sha256[:16]}..., {file} hashes to "
        f"{mismatch.found[:16]}...; the file was changed or damaged: copy it again or rebuild the plan"
    )
