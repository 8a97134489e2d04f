"""The converter's last step: the ``rockchip_npu`` plan of the compiled and checked graphs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...backends.rknn.convert import BuiltEngine, toolkit_version
from ...checkpoint import checkpoint_sha256, model_label, resolve_speech_tokenizer
from ...graphs.step_contract import StepContract
from ...plan.construct import StepArtifact, stateful_plan
from ...plan.model import ExecPlan
from .check import roles_by_graph, say


def write_plan(
    args: Any,  # the converter's ConvertRequest (convert.py imports this module)
    graphs: dict[str, Path],
    contracts: dict[str, StepContract],
    engines: dict[str, BuiltEngine],
    check: dict,
    formulation: dict,
) -> tuple[ExecPlan, Path]:
    """The ``rockchip_npu`` plan beside ``args.output``: each role's ``.rknn`` with its ONNX source copied beside it
    (the simulator and the CPU fallbacks compile that), the simulator check as its verification, the op placement
    and the toolchain's versions; written, and its path returned with it."""
    model = {"id": model_label(args.model_dir or args.onnx), "checkpoint_sha256": None}
    if args.model_dir:
        model["checkpoint_sha256"] = checkpoint_sha256(resolve_speech_tokenizer(args.model_dir))
    verification = {
        "runtime": "rknn-toolkit2 simulator",
        "against": "full decode" if "snr_db_vs_full_decode" in check else "onnxruntime",
        "snr_db": check.get("snr_db_vs_full_decode", check["snr_db_vs_onnxruntime"]),
    }
    if "max_abs_diff" in check:
        verification["max_abs_diff"] = check["max_abs_diff"]
    directory = args.output.parent
    sources = {}
    for path, roles in roles_by_graph(graphs).items():  # the plan directory is self-contained: its sources sit in it
        source = directory / path.name
        if path.resolve() != source.resolve():
            say(f"copying {path} beside the plan (the simulator and CPU fallbacks compile from it)")
            shutil.copyfile(path, source)
        sources |= dict.fromkeys(roles, source)
    plan = stateful_plan(
        hardware_class="rockchip_npu",
        backend="rknn",
        dtype="fp16",
        model=model,
        directory=directory,
        steps={
            role: StepArtifact(
                path=directory / Path(engine.report.path).name,
                contract=contracts[role],
                verification=verification,
                source=sources[role],
            )
            for role, engine in engines.items()
        },
        target=args.target,
        device_dir=args.device_dir,
        build={
            "tools": {"rknn-toolkit2": toolkit_version()},
            "regtask_warnings": {role: engine.report.regtask_warnings for role, engine in engines.items()},
            "register_overflow_allowed": args.allow_register_overflow,
            "placement": {role: engine.report.placement for role, engine in engines.items()},
            "cpu_ops_allowed": args.allow_cpu_ops,
            **formulation,  # graph_layout and pass_frames per role
            "dynamic_input": dynamic_input_sizes(engines, contracts),
            "simulator_check": {
                key: check[key]
                for key in ("frames", "steps", "per_step_snr_db", "min_step_snr_db", "mean_step_snr_db", "verdict")
            },
        },
    )
    return plan, plan.write(directory)


def dynamic_input_sizes(engines: dict[str, BuiltEngine], contracts: dict) -> dict[str, list[int]]:
    """``{.rknn file name: [B, ...]}`` of each file compiled with ``dynamic_input`` (for the plan's build record)."""
    sizes: dict[str, list[int]] = {}
    for role, engine in engines.items():
        if engine.report.shape_sets:
            sizes.setdefault(Path(engine.report.path).name, []).append(contracts[role].step_frames)
    return {name: sorted(frames) for name, frames in sizes.items()}
