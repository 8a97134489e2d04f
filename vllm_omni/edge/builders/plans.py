"""The builders of windowed programs and of stateful ONNX step graphs, and the plan's last step.

- :func:`build_windowed` (builder ``windowed``): ExecuTorch (or ``.pt2``) windowed programs via :mod:`.windowed`;
- :func:`build_onnx_steps` (builder ``onnx_steps``): stateful ONNX step graphs, each checked in onnxruntime
  against the full decode;
- :func:`write_and_load`: the last step of these and of the ExecuTorch-step builder (the plan written, then
  read back validated).

Which class runs which builder, and :func:`~.registry.build`, are :mod:`.registry`'s.
"""

from __future__ import annotations

from ..backends.onnx import external_data_name, graph_layout
from ..graphs.layouts import DEFAULT_LAYOUT
from ..hardware.registry import HardwareClass
from ..plan.construct import StepArtifact, stateful_plan, windowed_plan
from ..plan.model import ExecPlan
from .request import BuildRequest, class_default
from .state import tool_versions
from .steps import export_steps
from .windowed import WindowedExportRequest, export_windowed_programs


def build_windowed(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    manifest = export_windowed_programs(
        WindowedExportRequest(
            model=request.model,
            out_dir=request.out_dir,
            ramp=tuple(class_default(request.ramp, hardware_class, "ramp")),
            context_frames=class_default(request.context_frames, hardware_class, "context_frames"),
            backend=hardware_class.backend,
            partitioner=class_default(request.partitioner, hardware_class, "partitioner"),
            dtype=hardware_class.dtype,
            check=request.check,
            force=request.force,
            one_program=bool(class_default(None, hardware_class, "one_program")),
        ),
        progress=request.progress,
    )
    plan = windowed_plan(manifest, hardware_class=hardware_class.name, device_dir=request.device_dir)
    return write_and_load(plan, request)


def build_onnx_steps(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """The class's step graphs in its ``graph_layout``; with its ``external_data`` default, each graph's weights in
    an ONNX external data file the plan records beside it."""
    external_data = bool(class_default(None, hardware_class, "external_data"))
    graphs, model = export_steps(
        hardware_class,
        request,
        graph_layout=class_default(None, hardware_class, "graph_layout"),
        external_data=external_data,
    )
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


def stale_formulation(plan: ExecPlan, hardware_class: HardwareClass) -> str | None:
    """Why a valid ONNX step plan is not what :func:`build_onnx_steps` makes for its class now (a release that
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
