"""Execution plans: the JSON a device reads to know which artifacts decode a stream, and how.

A plan sits in one directory with the artifacts it names (paths relative to it), so the
directory can be copied or served as a whole. Its shape is pinned by a JSON Schema
(``schemas/exec_plan.schema.json``); :meth:`ExecPlan.load` checks that schema and then
(:mod:`.validation`) what a schema cannot say: every artifact present with its size and sha256, each artifact's contract
consistent with the plan's geometry, steps that share a cache sharing its layout, windows that
are exactly the ramp's schedule, and the plan's own id.

The Rockchip runtime reads only the ``speech_decoder`` block, passed as the session option
``qwen3_tts.exec_plan`` (a JSON string; its minimum is this block)::

    {"speech_decoder": {"impl": "rknn", "artifacts": {"main": PATH, "first": PATH}}}

Roles: a stateful plan has ``main`` and optionally ``first`` (a small first step that shares
the cache); a windowed plan has one role per window of the schedule (``window_c{context}_n{chunk}``).
No torch here: a board-side tool can read and check a plan.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import integrity
from ..files import read_json_file, write_json_atomically
from ..geometry import CodecGeometry
from ..graphs.step_contract import StepContract
from ..graphs.window_contract import Window, window_schedule
from . import validation
from .artifact import PlanArtifact, PlanFile
from .schema import PLAN_SCHEMA, PLAN_SCHEMA_VERSION, ExecPlanError, check_schema

PLAN_NAME = "exec_plan.json"
DEFAULT_DEVICE_DIR = "/data/qwen3-tts"


@dataclass(frozen=True)
class ExecPlan:
    """A validated plan. ``directory`` is where its artifacts are (``None`` for a plan not read from disk)."""

    hardware_class: str
    graph_kind: str
    backend: str
    dtype: str
    model: dict[str, Any]
    codec: CodecGeometry
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

    def files(self) -> dict[str, PlanFile]:
        """Every file of the plan's directory, once each (roles may share a file; its first record is kept): what a
        device downloads, the server lists under the plan, and :meth:`load` checks. Name -> record."""
        files: dict[str, PlanFile] = {}
        for artifact in self.artifacts.values():
            for record in artifact.files():
                files.setdefault(record.file, record)
        return files

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
            **self.codec.to_json(),
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
    def from_json(
        cls, payload: Any, directory: Path | None = None, source: str = "plan", schema_checked: bool = False
    ) -> ExecPlan:
        """Parse and check everything that does not need the artifact files (see :meth:`load`).

        ``schema_checked``: this exact document passed the JSON Schema before (remembered by
        :meth:`load`); the schema check, which imports jsonschema, is skipped. Nothing else is.
        """
        if not schema_checked:
            check_schema(payload, source)
        plan = cls(
            hardware_class=payload["hardware_class"],
            graph_kind=payload["graph_kind"],
            backend=payload["backend"],
            dtype=payload["dtype"],
            model=payload["model"],
            codec=CodecGeometry.from_json(payload),
            artifacts={
                role: PlanArtifact(
                    role=role,
                    file=row["file"],
                    sha256=row["sha256"],
                    size_bytes=row["size_bytes"],
                    contract=row["contract"],
                    source=row.get("source"),
                    external_data=row.get("external_data"),
                    verification=row.get("verification"),
                    method=row.get("method"),
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
        validation.check_contracts(plan, source)
        return plan

    @classmethod
    def load(cls, path: str | os.PathLike[str], check_sha256: bool = True) -> ExecPlan:
        """Read ``path`` (a plan file or the directory holding ``exec_plan.json``) and validate it fully.

        A plan document that passed once is remembered by the file's identity and the digest of its
        content (:mod:`..integrity`): loading it again skips only the JSON Schema pass (the slowest
        part of a small load); its artifacts are checked every time.
        """
        path, payload = read_json_file(
            path,
            PLAN_NAME,
            ExecPlanError,
            "no execution plan at {path}; build one with `python -m vllm_omni.edge build --hardware CLASS "
            "--model DIR_OR_ID --out DIR`",
            "rebuild the plan",
        )
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        known = integrity.remembered_sha256(path, kind="plan") == digest
        plan = cls.from_json(payload, directory=path.parent, source=str(path), schema_checked=known)
        validation.check_artifacts(plan, str(path), check_sha256=check_sha256)
        if not known:
            integrity.remember(path, digest, kind="plan")
        return plan

    # -- human-readable -----------------------------------------------------------------------------

    def summary(self) -> str:
        """A few lines a person can read: what the plan decodes with, and each artifact."""
        model = self.model.get("id", "?")
        lines = [
            f"plan {self.plan_id[:12]}  hardware class {self.hardware_class}"
            + (f" (target {self.target})" if self.target else ""),
            f"  decodes {self.graph_kind} with {self.backend} ({self.dtype}); model {model}",
            f"  geometry: {self.codec.num_quantizers} codebooks x {self.codec.codebook_size}, "
            f"{self.codec.samples_per_frame} samples per frame at {self.codec.sample_rate} Hz",
        ]
        if self.windowed is not None:
            lines.append(
                f"  windows: ramp {list(self.windowed['ramp'])}, context {self.windowed['context_frames']} frames, "
                f"partitioner {self.windowed.get('partitioner')}"
            )
        files: dict[str, int] = {}
        for role, artifact in self.artifacts.items():
            files[artifact.file] = artifact.size_bytes
            contract = artifact.contract
            if self.graph_kind == "stateful":
                shape = f"B={contract['step_frames']} N={contract['cache_numel']}"
            else:
                shape = f"{contract['context_frames']}+{contract['chunk_frames']} frames"
            check = artifact.verification or {}
            verdict = f", {check['snr_db']:.1f} dB" if isinstance(check.get("snr_db"), (int, float)) else ""
            if verdict and isinstance(check.get("max_abs_diff"), (int, float)):  # a near-silent decode's low SNR
                verdict += f" (max abs {check['max_abs_diff']:.2g})"
            where = artifact.file + (f":{artifact.method}" if artifact.method else "")
            lines.append(
                f"  {role:<16} {where:<28} {shape:<20} {artifact.size_bytes / 1e6:8.1f} MB "
                f"sha256 {artifact.sha256[:12]}{verdict}"
            )
        lines.append(
            f"  {len(self.artifacts)} artifacts in {len(files)} files, {sum(files.values()) / 1e6:.1f} MB; "
            f"on the device under {self.device_dir}"
        )
        delegation = self.build.get("delegation")
        if isinstance(delegation, dict):  # ExecuTorch programs: what runs outside the delegate
            for method, row in delegation.items():
                summary = row.get("summary") if isinstance(row, dict) else None
                lines.append(f"  delegation {summary if isinstance(summary, str) else f'{method}: not read'}")
        placement = self.build.get("placement")
        if isinstance(placement, dict):  # RKNN builds: which ops the toolkit placed on the CPU
            lines += _placement_lines(self, placement)
        return "\n".join(lines)


def _placement_lines(plan: ExecPlan, placement: dict[str, Any]) -> list[str]:
    """One ``placement`` line per compiled file of an RKNN build's ``build.placement`` (role -> the toolkit's
    op placement, ``None`` where none was read; roles sharing a file share one). Read leniently: ``build`` is
    a free-form record, so a missing or hand-edited field shows as ``?`` instead of failing the summary."""
    by_file: dict[str, Any] = {}
    for role, found in placement.items():
        artifact = plan.artifacts.get(role)
        by_file.setdefault(artifact.file if artifact is not None else str(role), found)
    allowed = plan.build.get("cpu_ops_allowed")
    judged = {False: " (expected)", True: " (kept by --allow-cpu-ops)"}[allowed] if isinstance(allowed, bool) else ""
    lines = []
    for file, found in by_file.items():
        where = f"{plan.target} {file}" if plan.target else file
        if not isinstance(found, dict):
            lines.append(f"  placement {where}: not read")
            continue
        npu_ops = found.get("npu_ops")
        if isinstance(npu_ops, list) and npu_ops and all(isinstance(count, int) for count in npu_ops):
            graphs = f"{len(npu_ops)} graphs, " if len(npu_ops) > 1 else ""
            npu = f"{graphs}{' + '.join(map(str, npu_ops))} ops on the NPU"
        else:
            npu = "? ops on the NPU"
        cpu_ops = found.get("cpu_ops")
        if isinstance(cpu_ops, dict):
            kinds = [
                f"{op} x{entry['count']}" if isinstance(entry, dict) and isinstance(entry.get("count"), int) else op
                for op, entry in sorted(cpu_ops.items())
            ]
            cpu = ", ".join(kinds) or "none"
        else:
            cpu = "?"
        missing = found.get("no_lowering")
        if isinstance(missing, list):
            ops = Counter(str(entry.get("op", "?")) if isinstance(entry, dict) else "?" for entry in missing)
            lowering = ", ".join(f"{op} x{count}" for op, count in ops.items()) or "none"
        else:
            lowering = "?"
        lines.append(f"  placement {where}: {npu}; on the CPU{judged}: {cpu}; without a lowering: {lowering}")
    return lines


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
