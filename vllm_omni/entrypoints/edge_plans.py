"""The execution plans a ``vllm serve --omni`` server publishes, built from the served model itself.

One directory per hardware class under ``--edge-artifacts``. A plan is kept when it validates
(schema, contracts, every file's size and sha256) and was built from the served checkpoint's own
``speech_tokenizer/`` (its ``checkpoint_sha256``); otherwise it is (re)built with the same code as
``python -m vllm_omni.edge build``, which keeps intact artifacts, so an interrupted start-up resumes.
The server also needs a CPU plan for itself (``response_format`` pcm/wav): the CPU class of this
machine, built beside the published ones whether or not it is published.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.edge.build.plans import build
from vllm_omni.edge.build.request import BuildRequest
from vllm_omni.edge.checkpoint import checkpoint_sha256, resolve_speech_tokenizer
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import get_hardware_class
from vllm_omni.edge.plan.model import ExecPlan

SLOW_BUILDS = {
    "rockchip_npu": "compiles fp16 .rknn steps in the converter venv (.venv-rknn): about 1.5 min at small "
    "sizes, about 3 min and 7.5 GB of RAM per step size at the released geometry"
}


class EdgeServingError(EdgeError):
    """The server cannot publish the plans it was asked for; the message says why and what to do."""


@dataclass(frozen=True)
class ServedPlans:
    """Published plans by class name, and the CPU plan the server decodes PCM with."""

    published: dict[str, ExecPlan]
    server_decoder: ExecPlan


def server_cpu_class() -> str:
    """The CPU class of this machine (its stateful ONNX plan decodes PCM on the server)."""
    return "cpu_arm64" if platform.machine().lower() in ("aarch64", "arm64") else "cpu_x86_64"


def parse_classes(value: str) -> list[str]:
    """``CLASS[,CLASS...]`` -> names, each checked against the registry (unknown names list the known ones)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise EdgeServingError("--edge-hardware names no class; `python -m vllm_omni.edge hardware list` shows them")
    for name in names:
        get_hardware_class(name)  # raises with the known names
    return list(dict.fromkeys(names))


def ensure_plan(name: str, model: str, directory: Path, checkpoint: str, progress: Callable[[str], None]) -> ExecPlan:
    """The validated plan of class ``name`` in ``directory``, built (or resumed) when missing or stale."""
    try:
        plan = ExecPlan.load(directory)
        if plan.model.get("checkpoint_sha256") == checkpoint:
            progress(f"{name}: plan {plan.plan_id[:12]} in {directory} is valid and matches the served model")
            return plan
        progress(f"{name}: the plan in {directory} was built from another checkpoint; rebuilding")
    except EdgeError as error:
        progress(f"{name}: no valid plan in {directory} ({str(error).splitlines()[0]}); building")
    if name in SLOW_BUILDS:
        progress(f"{name}: {SLOW_BUILDS[name]}")
    started = time.perf_counter()
    hardware_class = get_hardware_class(name)
    build(hardware_class, BuildRequest(model=model, out_dir=directory, progress=lambda m: progress(f"{name}: {m}")))
    try:
        plan = ExecPlan.load(directory)
    except EdgeError as error:
        raise EdgeServingError(f"{name}: the plan built in {directory} does not validate: {error}") from error
    progress(f"{name}: plan {plan.plan_id[:12]} built in {time.perf_counter() - started:.0f} s")
    return plan


def prepare_plans(
    model: str, classes: Sequence[str], artifacts: Path, progress: Callable[[str], None] = print
) -> ServedPlans:
    """Validate or build the plan of every class in ``classes`` (and the server's CPU plan) under ``artifacts``."""
    checkpoint = checkpoint_sha256(resolve_speech_tokenizer(model))
    artifacts = Path(artifacts)
    if artifacts.exists() and not artifacts.is_dir():
        raise EdgeServingError(f"--edge-artifacts {artifacts} is a file; give a directory (one plan folder per class)")
    published = {name: ensure_plan(name, model, artifacts / name, checkpoint, progress) for name in classes}
    cpu = server_cpu_class()
    decoder = published.get(cpu) or ensure_plan(cpu, model, artifacts / cpu, checkpoint, progress)
    return ServedPlans(published, decoder)


def load_served_plans(classes: Sequence[str], artifacts: Path) -> ServedPlans:
    """What ``prepare_plans`` left, read again by each API server process (sizes checked, not re-hashed)."""
    artifacts = Path(artifacts)
    published = {name: ExecPlan.load(artifacts / name, check_sha256=False) for name in classes}
    cpu = server_cpu_class()
    decoder = published.get(cpu) or ExecPlan.load(artifacts / cpu, check_sha256=False)
    return ServedPlans(published, decoder)
