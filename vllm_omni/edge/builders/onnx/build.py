"""The ``onnx`` builder: stateful ONNX step graphs, each checked in onnxruntime against the full decode, and
their plan (the CPU classes and the browser).
"""

from __future__ import annotations

from ...backends.onnx.graph import external_data_name
from ...hardware.registry import HardwareClass
from ...plan.construct import StepArtifact, stateful_plan
from ...plan.model import ExecPlan
from ..plans import write_and_load
from ..request import BuildRequest, class_default
from ..state import tool_versions
from .steps import export_steps


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
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
