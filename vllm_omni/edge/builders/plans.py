"""Builders: produce, verify and describe every artifact of a hardware class, then write its plan.

Each builder is called as ``builder(hardware_class, request) -> ExecPlan`` (the class names it as
``module:function``) and is resumable: an artifact already in ``out_dir`` whose recorded sha256
still matches (and was built from the same checkpoint) is kept and checked again instead of
rebuilt. The plan is written last, and only after it validates against the files.

- :func:`build_windowed`: ExecuTorch (or ``.pt2``) windowed programs via :mod:`.windowed`;
- :func:`build_onnx_steps`: stateful ONNX step graphs, each checked in onnxruntime against the full decode;
- :func:`~.executorch_steps.build_executorch_steps`: the stateful step as one multi-method ExecuTorch
  program (``npu_phone --graph stateful``), checked in the ExecuTorch runtime;
- :func:`~.rockchip.build_rknn`: the same ONNX steps, compiled to fp16 ``.rknn`` and checked in the
  rknn-toolkit2 simulator in the converter venv.
"""

from __future__ import annotations

from ..graphs.window_contract import check_ramp
from ..hardware.registry import HardwareClass
from ..plan.construct import StepArtifact, stateful_plan, windowed_plan
from ..plan.model import ExecPlan
from .request import BuildArgumentError, BuildRequest, check_out_dir, class_default
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
    graphs, model = export_steps(hardware_class, request)
    steps = {
        role: StepArtifact(
            path=path,
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


def write_and_load(plan: ExecPlan, request: BuildRequest) -> ExecPlan:
    """Write ``plan`` into ``request.out_dir`` and read it back through full validation (but the sha256s)."""
    path = plan.write(request.out_dir)
    loaded = ExecPlan.load(path, check_sha256=False)  # sha256s were computed from these files in this build
    request.progress(f"wrote {path}: plan {loaded.plan_id[:12]}, {len(loaded.artifacts)} artifacts, validated")
    return loaded


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """Build every artifact of ``hardware_class`` and return its validated plan.

    The request's sizes and output directory are checked first (:class:`~.request.BuildArgumentError`,
    :class:`~vllm_omni.edge.graphs.window_contract.WindowConfigError`), before any work.
    """
    graph_kind = request.graph or hardware_class.graph_kind
    if graph_kind not in hardware_class.graph_kinds:
        raise BuildArgumentError(
            f"--graph {graph_kind}: {hardware_class.name} builds {' or '.join(hardware_class.graph_kinds)} graphs; "
            "choose one of those (or another hardware class)"
        )
    check_out_dir(request.out_dir, request.force)
    if graph_kind == "windowed":
        check_ramp(
            class_default(request.ramp, hardware_class, "ramp"),
            class_default(request.context_frames, hardware_class, "context_frames"),
        )
    return hardware_class.load_builder(graph_kind)(hardware_class, request)
