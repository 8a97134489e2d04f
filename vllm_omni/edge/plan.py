"""Execution plans: the JSON a device reads to know which artifacts decode a stream, and how.

A plan sits in one directory with the artifacts it names (paths relative to it), so the
directory can be copied or served as a whole. Its shape is pinned by a JSON Schema
(``schemas/exec_plan.schema.json``); :meth:`ExecPlan.load` checks that schema and then what a
schema cannot say: every artifact present with its size and sha256, each artifact's contract
consistent with the plan's geometry, steps that share a cache sharing its layout, windows that
are exactly the ramp's schedule, and the plan's own id.

The Rockchip runtime reads only the ``speech_decoder`` block, passed as the session option
``qwen3_tts.exec_plan`` (DESIGN §5)::

    {"speech_decoder": {"impl": "rknn", "artifacts": {"main": PATH, "first": PATH}}}

Roles: a stateful plan has ``main`` and optionally ``first`` (a small first step that shares
the cache); a windowed plan has one role per window of the schedule (``window_c{context}_n{chunk}``).
No torch here: a board-side tool can read and check a plan.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from .errors import EdgeError
from .files import file_sha256, write_json_atomically
from .step_contract import StepContract, StepContractError
from .window_schedule import Window, WindowConfigError, check_ramp, window_schedule

PLAN_SCHEMA = "vllm-omni-edge/exec-plan"
PLAN_SCHEMA_VERSION = 2
PLAN_NAME = "exec_plan.json"
SCHEMA_PATH = Path(__file__).with_name("schemas") / "exec_plan.schema.json"
GRAPH_KINDS = ("stateful", "windowed")
DEFAULT_DEVICE_DIR = "/data/qwen3-tts"


class ExecPlanError(EdgeError):
    """A plan is malformed, of an unknown schema, inconsistent, or does not match the artifacts it names."""


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

    def to_json(self) -> dict[str, Any]:
        row = {"file": self.file, "sha256": self.sha256, "size_bytes": self.size_bytes, "contract": self.contract}
        if self.source is not None:
            row["source"] = self.source
        if self.verification is not None:
            row["verification"] = self.verification
        return row


def file_record(path: str | os.PathLike[str], relative_to: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"file", "sha256", "size_bytes"}`` of ``path``, its name relative to the plan directory."""
    path = Path(path)
    return {
        "file": path.relative_to(relative_to).as_posix(),
        "sha256": file_sha256(path),
        "size_bytes": path.stat().st_size,
    }


def window_contract(window: Window, num_quantizers: int, samples_per_frame: int) -> dict[str, Any]:
    """The contract of one windowed program: ``int64[1, Q, context + chunk]`` -> ``float32[1, chunk * hop]``."""
    return {
        "context_frames": window.context_frames,
        "chunk_frames": window.chunk_frames,
        "inputs": {"audio_codes": [1, num_quantizers, window.context_frames + window.chunk_frames]},
        "outputs": {"audio_values": [1, window.chunk_frames * samples_per_frame]},
    }


@dataclass(frozen=True)
class ExecPlan:
    """A validated plan. ``directory`` is where its artifacts are (``None`` for a plan not read from disk)."""

    hardware_class: str
    graph_kind: str
    backend: str
    dtype: str
    model: dict[str, Any]
    sample_rate: int
    samples_per_frame: int
    num_quantizers: int
    codebook_size: int
    artifacts: dict[str, PlanArtifact]
    target: str | None = None
    windowed: dict[str, Any] | None = None
    device_dir: str = DEFAULT_DEVICE_DIR
    build: dict[str, Any] = field(default_factory=dict)
    directory: Path | None = field(default=None, compare=False)

    # -- derived ------------------------------------------------------------------------------------

    @property
    def speech_decoder(self) -> dict[str, Any]:
        """The block the Rockchip runtime reads: impl and the artifacts' paths on the device."""
        root = self.device_dir.rstrip("/")
        return {"impl": self.backend, "artifacts": {role: f"{root}/{a.file}" for role, a in self.artifacts.items()}}

    @property
    def plan_id(self) -> str:
        """sha256 of the plan's canonical JSON (see :func:`_plan_digest`): what a stream's start message names."""
        return _plan_digest(self._body())

    def step_contract(self, role: str) -> StepContract:
        return StepContract.from_json(self.artifacts[role].contract, source=f"plan artifact {role!r}")

    @property
    def schedule(self) -> tuple[Window, ...]:
        if self.windowed is None:
            raise ExecPlanError(f"a {self.graph_kind} plan has no window schedule")
        return window_schedule(tuple(self.windowed["ramp"]), int(self.windowed["context_frames"]))

    def path(self, role: str) -> Path:
        if self.directory is None:
            raise ExecPlanError("this plan was not read from a directory; its artifact paths are relative to one")
        return self.directory / self.artifacts[role].file

    # -- JSON ---------------------------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        body = {
            "schema": PLAN_SCHEMA,
            "schema_version": PLAN_SCHEMA_VERSION,
            "hardware_class": self.hardware_class,
            "graph_kind": self.graph_kind,
            "backend": self.backend,
            "dtype": self.dtype,
            "target": self.target,
            "model": self.model,
            "sample_rate": self.sample_rate,
            "samples_per_frame": self.samples_per_frame,
            "num_quantizers": self.num_quantizers,
            "codebook_size": self.codebook_size,
            "device_dir": self.device_dir,
            "speech_decoder": self.speech_decoder,
            "artifacts": {role: artifact.to_json() for role, artifact in self.artifacts.items()},
            "build": self.build,
        }
        if self.windowed is not None:
            body["windowed"] = self.windowed
        return body

    def to_json(self) -> dict[str, Any]:
        body = self._body()
        return {**body, "plan_id": _plan_digest(body)}

    def write(self, directory: str | os.PathLike[str] | None = None) -> Path:
        directory = Path(directory) if directory is not None else self.directory
        if directory is None:
            raise ExecPlanError("write(): no directory given and the plan was not read from one")
        return write_json_atomically(directory / PLAN_NAME, self.to_json())

    @classmethod
    def from_json(cls, payload: Any, directory: Path | None = None, source: str = "plan") -> ExecPlan:
        """Parse and check everything that does not need the artifact files (see :meth:`load`)."""
        check_schema(payload, source)
        plan = cls(
            hardware_class=payload["hardware_class"],
            graph_kind=payload["graph_kind"],
            backend=payload["backend"],
            dtype=payload["dtype"],
            model=payload["model"],
            sample_rate=payload["sample_rate"],
            samples_per_frame=payload["samples_per_frame"],
            num_quantizers=payload["num_quantizers"],
            codebook_size=payload["codebook_size"],
            artifacts={
                role: PlanArtifact(
                    role=role,
                    file=row["file"],
                    sha256=row["sha256"],
                    size_bytes=row["size_bytes"],
                    contract=row["contract"],
                    source=row.get("source"),
                    verification=row.get("verification"),
                )
                for role, row in payload["artifacts"].items()
            },
            target=payload.get("target"),
            windowed=payload.get("windowed"),
            device_dir=payload["device_dir"],
            build=payload.get("build", {}),
            directory=directory,
        )
        if payload["plan_id"] != plan.plan_id:
            raise ExecPlanError(
                f"{source}: plan_id: the plan says {payload['plan_id'][:16]}..., its content hashes to "
                f"{plan.plan_id[:16]}...; the plan was edited by hand or damaged: rebuild it"
            )
        if payload["speech_decoder"] != plan.speech_decoder:
            raise ExecPlanError(
                f"{source}: speech_decoder: {payload['speech_decoder']} does not match the artifacts and device_dir "
                f"({plan.speech_decoder}); rebuild the plan"
            )
        plan.check_contracts(source)
        return plan

    @classmethod
    def load(cls, path: str | os.PathLike[str], check_sha256: bool = True) -> ExecPlan:
        """Read ``path`` (a plan file or the directory holding ``exec_plan.json``) and validate it fully."""
        path = Path(path)
        if path.is_dir():
            path = path / PLAN_NAME
        if not path.is_file():
            raise ExecPlanError(
                f"no execution plan at {path}; build one with `python -m vllm_omni.edge build --hardware CLASS "
                "--model DIR_OR_ID --out DIR`"
            )
        try:
            payload = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExecPlanError(f"{path} is not readable JSON ({exc}); rebuild the plan") from exc
        plan = cls.from_json(payload, directory=path.parent, source=str(path))
        plan.check_artifacts(str(path), check_sha256=check_sha256)
        return plan

    # -- validation ---------------------------------------------------------------------------------

    def check_contracts(self, source: str = "plan") -> None:
        """Contracts against the geometry and each other; windows against the ramp and context."""
        if self.graph_kind == "stateful":
            self._check_steps(source)
        else:
            self._check_windows(source)

    def _check_steps(self, source: str) -> None:
        if "main" not in self.artifacts or set(self.artifacts) - {"main", "first"}:
            raise ExecPlanError(
                f"{source}: artifacts: a stateful plan has roles 'main' and optionally 'first', found "
                f"{sorted(self.artifacts)}"
            )
        contracts = {}
        for role in self.artifacts:
            try:
                contracts[role] = self.step_contract(role)
            except (StepContractError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                raise ExecPlanError(f"{source}: artifacts.{role}.contract: {exc}") from exc
            contract = contracts[role]
            geometry = {
                "sample_rate": (contract.sample_rate, self.sample_rate),
                "samples_per_frame": (contract.hop, self.samples_per_frame),
                "num_quantizers": (contract.num_quantizers, self.num_quantizers),
                "codebook_size": (contract.codebook_size, self.codebook_size),
            }
            for name, (have, want) in geometry.items():
                if have != want:
                    raise ExecPlanError(
                        f"{source}: artifacts.{role}.contract: {name} is {have}, the plan's geometry says {want}; "
                        "the artifact comes from another checkpoint: rebuild the plan"
                    )
            shapes = self.artifacts[role].contract
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

    def _check_windows(self, source: str) -> None:
        if self.windowed is None:
            raise ExecPlanError(f"{source}: windowed: a windowed plan needs its ramp and context_frames")
        try:
            ramp = check_ramp(tuple(self.windowed["ramp"]), int(self.windowed["context_frames"]))
        except WindowConfigError as exc:
            raise ExecPlanError(f"{source}: windowed: {exc}") from exc
        expected = {w.name: w for w in window_schedule(ramp, int(self.windowed["context_frames"]))}
        if set(self.artifacts) != set(expected):
            raise ExecPlanError(
                f"{source}: artifacts: the ramp {list(ramp)} with context {self.windowed['context_frames']} needs "
                f"programs {sorted(expected)}, the plan lists {sorted(self.artifacts)}"
            )
        for role, window in expected.items():
            want = window_contract(window, self.num_quantizers, self.samples_per_frame)
            have = self.artifacts[role].contract
            for key, value in want.items():
                if have.get(key) != value:
                    raise ExecPlanError(
                        f"{source}: artifacts.{role}.contract.{key}: {have.get(key)}, but window {role} with "
                        f"{self.num_quantizers} codebooks and hop {self.samples_per_frame} needs {value}"
                    )

    def check_artifacts(self, source: str = "plan", check_sha256: bool = True) -> None:
        """Every artifact (and recorded source graph) present with the plan's size and sha256."""
        if self.directory is None:
            raise ExecPlanError(f"{source}: the plan was not read from a directory; nothing to check files against")
        for role, artifact in self.artifacts.items():
            self._check_file(
                source, f"artifacts.{role}", artifact.file, artifact.size_bytes, artifact.sha256, check_sha256
            )
            if artifact.source is not None:
                row = artifact.source
                self._check_file(
                    source, f"artifacts.{role}.source", row["file"], row["size_bytes"], row["sha256"], check_sha256
                )

    def _check_file(self, source: str, field_name: str, file: str, size: int, sha256: str, check_sha256: bool) -> None:
        path = self.directory / file
        if not path.is_file():
            raise ExecPlanError(
                f"{source}: {field_name}.file: {file} is missing from {self.directory}; copy the whole plan "
                "directory, or rebuild it"
            )
        found = path.stat().st_size
        if found != size:
            raise ExecPlanError(
                f"{source}: {field_name}.size_bytes: the plan says {size} bytes, {file} has {found}; the file is "
                "truncated or replaced: copy it again or rebuild the plan"
            )
        if check_sha256:
            digest = file_sha256(path)
            if digest != sha256:
                raise ExecPlanError(
                    f"{source}: {field_name}.sha256: the plan says {sha256[:16]}..., {file} hashes to "
                    f"{digest[:16]}...; the file was changed or damaged: copy it again or rebuild the plan"
                )

    # -- human-readable -----------------------------------------------------------------------------

    def summary(self) -> str:
        """A few lines a person can read: what the plan decodes with, and each artifact."""
        model = self.model.get("id", "?")
        lines = [
            f"plan {self.plan_id[:12]}  hardware class {self.hardware_class}"
            + (f" (target {self.target})" if self.target else ""),
            f"  decodes {self.graph_kind} with {self.backend} ({self.dtype}); model {model}",
            f"  geometry: {self.num_quantizers} codebooks x {self.codebook_size}, {self.samples_per_frame} samples per "
            f"frame at {self.sample_rate} Hz",
        ]
        if self.windowed is not None:
            lines.append(
                f"  windows: ramp {list(self.windowed['ramp'])}, context {self.windowed['context_frames']} frames, "
                f"partitioner {self.windowed.get('partitioner')}"
            )
        total = 0
        for role, artifact in self.artifacts.items():
            total += artifact.size_bytes
            contract = artifact.contract
            if self.graph_kind == "stateful":
                shape = f"B={contract['step_frames']} N={contract['cache_numel']}"
            else:
                shape = f"{contract['context_frames']}+{contract['chunk_frames']} frames"
            check = artifact.verification or {}
            verdict = f", {check['snr_db']:.1f} dB" if isinstance(check.get("snr_db"), (int, float)) else ""
            lines.append(
                f"  {role:<16} {artifact.file:<28} {shape:<20} {artifact.size_bytes / 1e6:8.1f} MB "
                f"sha256 {artifact.sha256[:12]}{verdict}"
            )
        lines.append(f"  {len(self.artifacts)} artifacts, {total / 1e6:.1f} MB; on the device under {self.device_dir}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StepArtifact:
    """A built step graph on its way into a plan: the file, its contract, how it was checked, its ONNX source."""

    path: Path
    contract: StepContract
    verification: dict[str, Any] | None = None
    source: Path | None = None


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
    artifacts = {
        role: PlanArtifact(
            role=role,
            **file_record(step.path, directory),
            contract=step.contract.to_json(),
            source=file_record(step.source, directory) if step.source is not None else None,
            verification=step.verification,
        )
        for role, step in steps.items()
    }
    plan = ExecPlan(
        hardware_class=hardware_class,
        graph_kind="stateful",
        backend=backend,
        dtype=dtype,
        model={"geometry": main.geometry, **model},
        sample_rate=main.sample_rate,
        samples_per_frame=main.hop,
        num_quantizers=main.num_quantizers,
        codebook_size=main.codebook_size,
        artifacts=artifacts,
        target=target,
        device_dir=device_dir,
        build=build or {},
        directory=directory,
    )
    check_schema(plan.to_json(), "new plan")
    plan.check_contracts("new plan")
    return plan


def session_option(plan: ExecPlan) -> str:
    """The ``qwen3_tts.exec_plan=...`` session option: the plan's ``speech_decoder`` block as compact JSON."""
    return "qwen3_tts.exec_plan=" + json.dumps({"speech_decoder": plan.speech_decoder}, separators=(",", ":"))


def _plan_digest(body: dict[str, Any]) -> str:
    """sha256 of what decides the audio: everything but ``build`` and each artifact's ``verification``
    (timings and check results change on every rebuild of identical artifacts)."""
    identity = {key: value for key, value in body.items() if key not in ("build", "plan_id")}
    identity["artifacts"] = {
        role: {key: value for key, value in row.items() if key != "verification"}
        for role, row in body.get("artifacts", {}).items()
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@cache
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def check_schema(payload: Any, source: str = "plan") -> None:
    """Raise :class:`ExecPlanError` naming the first field that breaks the JSON Schema (schema id first)."""
    if not isinstance(payload, dict):
        raise ExecPlanError(f"{source}: a plan is a JSON object, found {type(payload).__name__}")
    if payload.get("schema") != PLAN_SCHEMA:
        raise ExecPlanError(f"{source}: schema: expected {PLAN_SCHEMA!r}, found {payload.get('schema')!r}")
    if payload.get("schema_version") != PLAN_SCHEMA_VERSION:
        raise ExecPlanError(
            f"{source}: schema_version: {payload.get('schema_version')!r} is not one this reader knows "
            f"({PLAN_SCHEMA_VERSION}); rebuild the plan with this version of vllm-omni-edge, or update the reader"
        )
    import jsonschema

    validator = jsonschema.Draft202012Validator(plan_schema())
    errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        raise ExecPlanError(f"{source}: {where}: {error.message}")
