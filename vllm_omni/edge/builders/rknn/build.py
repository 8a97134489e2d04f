"""The ``rknn`` builder (``rockchip_npu``): ONNX step graphs here, their fp16 ``.rknn`` compile in the converter venv.

rknn-toolkit2 pins its own torch/numpy/onnx, so it lives in a venv of its own (``make setup-rknn``).
This builder exports (or keeps) the ONNX steps in this process, then runs
``python -m vllm_omni.edge rknn-convert`` in the converter venv (the package must be installed
there too), which compiles, checks in the simulator and writes the plan, and reports its outcome
as JSON (``--outcome-json``: a status of :data:`~.errors.OUTCOME_REASONS`) instead of an exit code.

By default (the class's ``one_step_graph``) one graph at a symbolic B is exported and compiled once
with rknn-toolkit2's ``dynamic_input`` for the first and main step sizes: one ``.rknn``, one copy of
the weights, named by both plan roles. ``one_step_graph=False`` (``--separate-step-graphs``) keeps
a static graph and a ``.rknn`` per step size.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ...errors import EdgeError, EdgeExportError
from ...graphs.layouts import NPU_LAYOUT
from ...hardware.registry import HardwareClass
from ...plan.model import ExecPlan
from ...plan.schema import ExecPlanError
from ..onnx.steps import export_steps
from ..request import BuildRequest
from .errors import OUTCOME_REASONS

REPO_ROOT = Path(__file__).resolve().parents[4]
CONVERTER_PYTHON_ENV = "VLLM_OMNI_EDGE_RKNN_PYTHON"
CONVERTER_COMMAND = ("-m", "vllm_omni.edge", "rknn-convert")  # the converter venv's vllm-omni-edge
# Steps longer than this decode in equal passes on these SoCs: rknn-toolkit2 2.5.0's compiler stops
# on an internal check (SIGILL) for rk3576 at B=64 in one pass, and compiles B=16 passes
# (docs/hardware/rockchip-npu.md).
MAX_PASS_FRAMES = {"rk3576": 16}


def converter_python() -> str:
    """The interpreter that has rknn-toolkit2: $VLLM_OMNI_EDGE_RKNN_PYTHON, this one, or the repo's .venv-rknn."""
    configured = os.environ.get(CONVERTER_PYTHON_ENV)
    if configured:
        if not Path(configured).is_file():
            raise EdgeError(
                f"{CONVERTER_PYTHON_ENV}={configured} does not exist; point it at the converter venv's python"
            )
        return configured
    if importlib.util.find_spec("rknn") is not None:
        return sys.executable
    venv = REPO_ROOT / ".venv-rknn" / "bin" / "python"
    if venv.is_file():
        return str(venv)
    raise EdgeError(
        "rockchip_npu needs rknn-toolkit2, which lives in its own venv: run `make setup-rknn` (it makes "
        f".venv-rknn), or set {CONVERTER_PYTHON_ENV} to a python that has it"
    )


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """The class's ONNX steps exported here (or kept), then compiled, checked and planned by the converter venv for
    the request's target; the plan it wrote, validated."""
    target = request.target or hardware_class.default_target
    if target not in hardware_class.targets:
        raise EdgeExportError(
            f"unknown target {target!r} for {hardware_class.name}; known: {', '.join(hardware_class.targets)}"
        )
    python = converter_python()  # before any export work
    # The NPU formulation keeps every register field in range and every op lowered
    # (docs/hardware/rockchip-npu.md); the converter refuses any REGTASK warning and any op off the NPU
    # beyond its allow-list, and this builder never allows either (no --allow-* flag below).
    graphs, _ = export_steps(hardware_class, request, graph_layout=NPU_LAYOUT, pass_frames=MAX_PASS_FRAMES.get(target))
    kept = _kept_rknn_plan(request, target, {role: path for role, (path, _, _) in graphs.items()})
    if kept is not None:
        request.progress(f"kept the {target} .rknn steps of plan {kept.plan_id[:12]}: built from the same ONNX graphs")
        return kept
    main = graphs["main"][0]
    command = [python, *CONVERTER_COMMAND, "--model-dir", str(request.model), "--onnx", str(main)]
    if "first" in graphs and graphs["first"][0] == main:  # one dynamic graph: one .rknn for both step sizes
        command += ["--first-codes-length", str(graphs["first"][1].step_frames)]
    elif "first" in graphs:
        command += ["--first-onnx", str(graphs["first"][0])]
    command += ["--target", target, "--output", str(main.with_suffix(".rknn")), "--device-dir", request.device_dir]
    request.progress(f"compiling for {target} in the converter venv ({python}); this takes minutes per step size")
    with tempfile.TemporaryDirectory(prefix="rknn-convert-") as scratch:
        outcome_path = Path(scratch) / "outcome.json"
        result = subprocess.run(
            [*command, "--outcome-json", str(outcome_path)], stdout=sys.stderr, stderr=sys.stderr, check=False
        )
        outcome = _read_outcome(outcome_path)
    if outcome.get("status") != "ok":
        what = OUTCOME_REASONS.get(outcome.get("status")) or died_how(result.returncode)
        detail = f": {outcome['error']}" if outcome.get("error") else ""
        raise EdgeExportError(
            f"the RKNN conversion failed ({what}){detail}; its report and build logs are beside "
            f"{main.with_suffix('.rknn')}"
        )
    plan = ExecPlan.load(request.out_dir)
    request.progress(f"plan {plan.plan_id[:12]} validated ({len(plan.artifacts)} artifacts)")
    return plan


def died_how(returncode: int) -> str:
    """Why a converter that wrote no outcome stopped: killed by a signal, or an exit code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if name == "SIGKILL":
        return "the converter was killed (SIGKILL; out of memory?); its build log says how far it got"
    return f"rknn-toolkit2 crashed ({name}); its build log says how far it got"


def _kept_rknn_plan(request: BuildRequest, target: str, sources: dict[str, Path]) -> ExecPlan | None:
    try:
        plan = ExecPlan.load(request.out_dir)
    except ExecPlanError:
        return None
    if plan.backend != "rknn" or plan.target != target or set(plan.artifacts) != set(sources):
        return None
    # load() checked each recorded source against its sha256 in this directory: same name, same graph.
    for role, path in sources.items():
        source = plan.artifacts[role].source
        if source is None or source["file"] != path.name:
            return None
    return plan


def _read_outcome(path: Path) -> dict:
    """The converter's JSON outcome; empty when it died before writing one (its stderr says why)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
