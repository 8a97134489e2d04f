"""The ``onnx`` builder: stateful ONNX step graphs, each checked in onnxruntime against the full decode, and
their plan (the CPU classes and the browser); and whether a plan on disk is still what it builds
(:func:`stale_formulation`).
"""

from __future__ import annotations

from ...backends.onnx.graph import external_data_name, graph_layout
from ...graphs.layouts import DEFAULT_LAYOUT
from ...hardware.registry import HardwareClass
from ...plan.construct import StepArtifact, stateful_plan
from ...plan.model import ExecPlan
from ..plans import write_and_load
from ..request import BuildRequest, class_default
from ..state import tool_versions
from .steps import export_steps


def formulation(hardware_class: HardwareClass) -> tuple[str | None, bool]:
    """The class's step graph layout (None: the default one) and whether its graphs keep their weights in an
    external data file beside them: what :func:`build` makes and :func:`stale_formulation` compares a plan with."""
    layout = class_default(None, hardware_class, "graph_layout")
    return layout, bool(class_default(None, hardware_class, "external_data"))


def stale_formulation(plan: ExecPlan, hardware_class: HardwareClass) -> str | None:
    """Why a valid ONNX step plan is not what :func:`build` makes for its class now (a release that changed the
    class's graph layout or where the weights are kept), or None; other plans are never stale here."""
    if plan.backend != "onnxruntime" or plan.graph_kind != "stateful" or plan.directory is None:
        return None
    layout, beside = formulation(hardware_class)
    wanted, found = layout or DEFAULT_LAYOUT, graph_layout(plan.path("main"))
    if found != wanted:
        return f"its step graph is in the {found} layout, the class's is {wanted}"
    if beside != (plan.artifacts["main"].external_data is not None):
        return "the class keeps the graph's weights " + ("beside it" if beside else "in it")
    return None


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """The class's step graphs in its ``graph_layout``; with its ``external_data`` default, each graph's weights in
    an ONNX external data file the plan records beside it."""
    layout, external_data = formulation(hardware_class)
    graphs, model = export_steps(hardware_class, request, graph_layout=layout, external_data=external_data)
    steps = {
        role: StepArtifact(
            path=path,
            external_data=path.with_name(external_data_name(path)) if external_data else None,
            contract=contract,
            verification=None
            if check is None
            else {"runtime": "onnxruntime", "against": "full decode", **check.to_json()},
        )
        for role, (path, contract, check) in graphs.items()
    }
    plan = stateful_plan(
        hardware_class=hardware_class.name,
        backend=hardware_class.backend,
        dtype=hardware_class.dtype,
        model=model,
        directory=request.out_dir,
        steps=steps,
        device_dir=request.device_dir,
        build={"tools": tool_versions("onnx", "onnxruntime", "torch")},
    )
    return write_and_load(plan, request)
