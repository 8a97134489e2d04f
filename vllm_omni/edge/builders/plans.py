"""What the builders share at the end: the plan written, then read back validated (:func:`write_and_load`),
and whether a plan on disk is of an older formulation than its class builds now (:func:`stale_formulation`).
"""

from __future__ import annotations

from ..backends.onnx.graph import graph_layout
from ..graphs.layouts import DEFAULT_LAYOUT
from ..hardware.registry import HardwareClass
from ..plan.model import ExecPlan
from .request import BuildRequest, class_default


def stale_formulation(plan: ExecPlan, hardware_class: HardwareClass) -> str | None:
    """Why a valid ONNX step plan is not what :func:`.onnx.build.build` makes for its class now (a release that
    changed the class's graph layout or where the weights are kept), or None; other plans are never stale here."""
    if plan.backend != "onnxruntime" or plan.graph_kind != "stateful" or plan.directory is None:
        return None
    layout = graph_layout(plan.path("main"))
    wanted = class_default(None, hardware_class, "graph_layout") or DEFAULT_LAYOUT
    if layout != wanted:
        return f"its step graph is in the {layout} layout, the class's is {wanted}"
    beside = bool(class_default(None, hardware_class, "external_data"))
    if beside != (plan.artifacts["main"].external_data is not None):
        return "the class keeps the graph's weights " + ("beside it" if beside else "in it")
    return None


def write_and_load(plan: ExecPlan, request: BuildRequest) -> ExecPlan:
    """Write ``plan`` into ``request.out_dir`` and read it back through full validation (but the sha256s)."""
    path = plan.write(request.out_dir)
    loaded = ExecPlan.load(path, check_sha256=False)  # sha256s were computed from these files in this build
    request.progress(f"wrote {path}: plan {loaded.plan_id[:12]}, {len(loaded.artifacts)} artifacts, validated")
    return loaded
