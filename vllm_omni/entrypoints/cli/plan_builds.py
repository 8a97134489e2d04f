"""The start-up hand-off's plans: validated, or built from the served model, before the engine starts.

A plan is kept when it validates (schema, contracts, every file's size and sha256) and was built from
the served checkpoint's own ``speech_tokenizer/`` (its ``checkpoint_sha256``); otherwise it is
(re)built with the same code as ``python -m vllm_omni.edge build``, which keeps intact artifacts, so
an interrupted start-up resumes. The API server processes then only read them (:mod:`..plans.edge_plans`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm_omni.edge.builders.registry import build, stale_formulation
from vllm_omni.edge.builders.request import BuildRequest
from vllm_omni.edge.checkpoint import checkpoint_sha256, model_label, resolve_speech_tokenizer
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import get_hardware_class
from vllm_omni.edge.plan.model import ExecPlan

from ..plans.edge_plans import EdgeServingError, ServedPlans, server_cpu_class

SLOW_BUILDS = {
    "rockchip_npu": "compiles fp16 .rknn steps in the converter venv (.venv-rknn): about 1.5 min at small "
    "sizes, about 3 min and 7.5 GB of RAM per step size at the released geometry"
}


def ensure_plan(name: str, model: str, directory: Path, checkpoint: str, progress: Callable[[str], None]) -> ExecPlan:
    """The validated plan of class ``name`` in ``directory``, built (or resumed) when missing or stale."""
    try:
        plan = ExecPlan.load(directory)
        if plan.model.get("checkpoint_sha256") != checkpoint:
            progress(f"{name}: the plan in {directory} was built from another checkpoint; rebuilding")
        elif str(plan.model.get("id")) != model_label(str(plan.model.get("id"))):  # an older build's path
            progress(f"{name}: the plan in {directory} names the model by its path; rebuilding (artifacts kept)")
        elif reason := stale_formulation(plan, get_hardware_class(name)):
            progress(f"{name}: the plan in {directory} is of an older formulation ({reason}); rebuilding")
        else:
            progress(f"{name}: plan {plan.plan_id[:12]} in {directory} is valid and matches the served model")
            return plan
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
