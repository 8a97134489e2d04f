"""The converter: compile the stateful step graph(s) to fp16 ``.rknn``, check them in the simulator, write the plan.

Runs where rknn-toolkit2 is installed, the converter venv (``make setup-rknn``); its command line
is ``vllm-omni-edge rknn-convert`` (:mod:`vllm_omni.edge.cli.rknn_convert`)::

    .venv-rknn/bin/vllm-omni-edge rknn-convert --model-dir CKPT --codes-length 16 \\
        --first-codes-length 2 --dynamic-input --target rk3588 --output out/rknn/step_b2_b16.rknn
    .venv-rknn/bin/vllm-omni-edge rknn-convert --onnx step_b16.onnx \\
        --output out/rknn/step_b16.rknn                      # compile an existing step graph alone

ONNX only (either venv): ``--skip-rknn`` exports the checked ONNX step graph and stops,
``--check-only`` re-runs the check of an existing one.

``--dynamic-input`` (with ``--first-codes-length``) exports one graph at a symbolic B instead of one
per step size, and compiles it once with rknn-toolkit2's ``dynamic_input`` for both sizes: one
``.rknn`` (one copy of the weights) that the plan's ``first`` and ``main`` roles both name. An
existing dynamic graph given with ``--onnx`` is compiled that way for ``--first-codes-length`` and
its own largest size.

Graphs exported here use the NPU formulation (``--graph-layout time_on_height``,
:mod:`vllm_omni.edge.graphs.npu_layout`), which keeps every register field of rk3588/rk3576 in
range. A build whose toolkit log holds any ``REGTASK: The bit width of field value exceeds the
limit`` line fails with :class:`RegisterOverflowError` unless ``--allow-register-overflow`` is
given (the ``rknn`` builder of ``rockchip_npu`` never gives it); the count is in the report and the plan.
Likewise the op placement the toolkit prints (which ops run on the CPU, which have no lowering)
goes into the report and the plan's ``build.placement``, and a build that places an op kind on
the CPU that :data:`~vllm_omni.edge.backends.rknn.convert.EXPECTED_CPU_OPS` does not name, or any op
without a lowering, fails with :class:`CpuOpsError` unless ``--allow-cpu-ops`` is given (the
``rknn`` builder never gives it either).

The simulator check is :mod:`.check`'s, the plan :mod:`.plan`'s, the errors :mod:`.errors`'.
"""

from __future__ import annotations

import json
import logging
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...backends.onnx.graph import graph_contract, graph_formulation, op_report
from ...backends.rknn.convert import (
    BuiltEngine,
    Placement,
    build_engine,
    require_toolkit,
    toolkit_version,
)
from ...backends.rknn.run import shape_sets
from ...checkpoint import load_code2wav_decoder
from ...graphs.layouts import NPU_LAYOUT, layouts_for
from ...graphs.step_contract import StepContractError
from ...plan.model import DEFAULT_DEVICE_DIR, ExecPlan
from ..onnx.steps import check_step_graph, export_checked_step
from .check import roles_by_graph, say, simulator_check
from .errors import ConvertUsageError, CpuOpsError, RegisterOverflowError, SimulatorCheckError
from .plan import dynamic_input_sizes, write_plan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertRequest:
    """One conversion; the fields are the command line's options (:mod:`vllm_omni.edge.cli.rknn_convert`)."""

    output: Path
    model_dir: str | None = None
    onnx: Path | None = None
    first_onnx: Path | None = None
    codes_length: int = 16
    first_codes_length: int | None = None
    target: str = "rk3588"
    opt_level: int = 3
    opset: int = 17
    skip_rknn: bool = False
    check_only: bool = False
    device_dir: str = DEFAULT_DEVICE_DIR
    check_steps: int = 20
    graph_layout: str = NPU_LAYOUT
    pass_frames: int | None = None
    allow_register_overflow: bool = False
    allow_cpu_ops: bool = False  # keep a build with ops off the NPU that EXPECTED_CPU_OPS does not name
    dynamic_input: bool = False  # one graph and one .rknn for the first and main step sizes


@dataclass(frozen=True)
class ConvertResult:
    """A finished conversion: the plan written beside the ``.rknn`` files, the report and the check."""

    plan: ExecPlan
    plan_path: Path
    report_path: Path
    check: dict[str, Any]


def onnx_paths(args: ConvertRequest) -> tuple[Path, Path | None]:
    """The graph(s) to export: beside ``--output``, and a first-step graph unless one graph serves both."""
    base = args.output if args.output.suffix == ".onnx" else args.output.with_suffix(".onnx")
    if not args.first_codes_length or args.dynamic_input:
        return base, None
    return base, base.with_name(f"{base.stem}_first_b{args.first_codes_length}.onnx")


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConvertUsageError(f"cannot create the output directory {directory}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK):
        raise ConvertUsageError(f"the output directory {directory} is not writable; choose another --output")


def run(args: ConvertRequest, report: Callable[[str], None] = logger.info) -> ConvertResult | None:
    """Convert as ``args`` asks; ``None`` when it stops before compiling (``skip_rknn``, ``check_only``).

    ``report`` receives the result lines (graph contracts, check numbers); progress goes to stderr.
    """
    if args.codes_length < 1 or (args.first_codes_length is not None and args.first_codes_length < 1):
        raise ConvertUsageError("--codes-length and --first-codes-length must be >= 1")
    if args.check_steps < 3:
        raise ConvertUsageError(
            f"--check-steps must be >= 3 (the check streams through the cache), found {args.check_steps}"
        )
    if args.graph_layout not in layouts_for("onnx", "npu"):
        raise ConvertUsageError(
            f"--graph-layout must be one of {', '.join(layouts_for('onnx', 'npu'))}, found {args.graph_layout}"
        )
    if args.dynamic_input and (args.first_onnx or not args.first_codes_length):
        raise ConvertUsageError(
            "--dynamic-input compiles one graph for two step sizes: give --first-codes-length (and no --first-onnx)"
        )
    compile_rknn = not (args.skip_rknn or args.check_only)
    if args.onnx is None and not args.model_dir:
        raise ConvertUsageError(
            "no checkpoint: pass --model-dir DIR_OR_HUB_ID, set QWEN3_TTS_MODEL, or give --onnx FILE"
        )
    if compile_rknn and args.output.suffix not in (".rknn", ".onnx"):
        raise ConvertUsageError(f"--output must end in .rknn (or .onnx), found {args.output.name}")
    if compile_rknn:
        require_toolkit()  # before any export work: say how to make the converter venv
    check_writable(args.output.parent)

    decoder = load_code2wav_decoder(args.model_dir) if args.model_dir else None
    graphs = existing_graphs(args) if args.onnx else export_graphs(args, decoder, report)
    if not compile_rknn:
        return None
    return compile_and_check(args, graphs, decoder)


def existing_graphs(args: ConvertRequest) -> dict[str, Path]:
    graphs = {"main": args.onnx}
    if args.first_onnx:
        graphs["first"] = args.first_onnx
    for path in graphs.values():
        if not path.is_file():
            raise ConvertUsageError(f"no ONNX file at {path}")
    return graphs


def export_graphs(args: ConvertRequest, decoder, report: Callable[[str], None]) -> dict[str, Path]:
    main_path, first_path = onnx_paths(args)
    graphs = {"main": main_path} | ({"first": first_path} if first_path else {})
    sizes = {"main": args.codes_length, "first": args.first_codes_length}
    first = args.first_codes_length if args.dynamic_input else None  # the dynamic graph's check runs both
    for role, path in graphs.items():
        if args.check_only:
            match = check_step_graph(decoder, path, first_step_frames=first)
            report(f"{path}: onnxruntime stepwise vs full decode: {match.describe()}")
            continue
        export_checked_step(
            decoder,
            sizes[role],
            path,
            opset=args.opset,
            graph_layout=args.graph_layout,
            pass_frames=args.pass_frames,
            form="npu_dynamic" if args.dynamic_input else "npu",
            first_step_frames=first,
        )
        contract = graph_contract(path)
        report(
            f"{path}: B={contract.step_frames} N={contract.cache_numel} head_dim={contract.head_dim} "
            f"({path.stat().st_size / 1e6:.1f} MB)"
        )
    return graphs


def compile_and_check(args: ConvertRequest, graphs: dict[str, Path], decoder) -> ConvertResult:
    contracts = {}
    for role, path in graphs.items():
        try:
            contracts[role] = graph_contract(path)
        except StepContractError as exc:
            raise ConvertUsageError(f"--onnx {path} is not a Qwen3-TTS stateful step graph: {exc}") from exc
        risky = op_report(path).risky_for(symbolic_b=contracts[role].dynamic)
        if risky:
            say(
                f"warning: {path.name} has ops on the RKNN risk list ({', '.join(sorted(risky))}); "
                f"rknn-toolkit2 2.3.x aborted on such graphs, 2.5.0 converted them in a probe; installed: "
                f"{toolkit_version()}"
            )
    formulations = {role: graph_formulation(path) for role, path in graphs.items()}  # one read of each file
    graphs, contracts = shared_graph_roles(args, graphs, contracts, main_layout=formulations["main"][0])
    if "first" in graphs and "first" not in formulations:  # one dynamic graph serves both roles
        formulations["first"] = formulations["main"]
    if "first" in contracts and not contracts["first"].shares_cache_with(contracts["main"]):
        raise ConvertUsageError(
            "the first and main graphs do not share a cache layout; export both from one checkpoint"
        )
    rknn_main = args.output if args.output.suffix == ".rknn" else args.output.with_suffix(".rknn")
    outputs = {"main": rknn_main}
    if "first" in graphs:
        shared = graphs["first"] == graphs["main"]
        outputs["first"] = rknn_main if shared else rknn_main.with_name(graphs["first"].with_suffix(".rknn").name)

    layouts = {role: layout for role, (layout, _) in formulations.items()}
    passes = {role: frames or contracts[role].step_frames for role, (_, frames) in formulations.items()}
    engines: dict[str, BuiltEngine] = {}
    peak_rss_mb: dict[str, int] = {}
    try:
        for path, roles in roles_by_graph(graphs).items():
            sizes = sorted({contracts[role].step_frames for role in roles})
            contract = max((contracts[role] for role in roles), key=lambda contract: contract.step_frames)
            say(
                f"compiling {path.name} (B={'/'.join(map(str, sizes))}, N={contract.cache_numel}) for {args.target}, "
                f"fp16{' with dynamic_input (one .rknn for every B)' if len(sizes) > 1 else ''}"
            )
            engine = build_engine(
                path,
                outputs[roles[0]],
                target=args.target,
                opt_level=args.opt_level,
                simulate=True,
                inputs=contract.input_shapes(),
                outputs=contract.output_shapes(),
                shape_sets=shape_sets([contracts[role] for role in roles]),
            )
            report = engine.report
            for role in roles:
                engines[role] = engine
                peak_rss_mb[role] = peak_rss_so_far_mb()
            say(
                f"  {outputs[roles[0]].name}: {report.size_bytes / 1e6:.1f} MB in {report.build_seconds:.1f} s "
                f"(converter process peak RSS so far {peak_rss_mb[roles[0]]} MB); REGTASK bit-width warnings: "
                f"{report.regtask_warnings}; {describe_placement(report.placement)} (log: {report.log_path})"
            )
        overflow = {role: engine.report.regtask_warnings for role, engine in engines.items()}
        overflow = {role: count for role, count in overflow.items() if count}
        off_npu = {role: unexpected_cpu_ops(engine.report.placement, args.target) for role, engine in engines.items()}
        off_npu = {role: kinds for role, kinds in off_npu.items() if kinds}
        check = simulator_check(args, graphs, contracts, engines, decoder)
    finally:
        for engine in {id(engine): engine for engine in engines.values()}.values():
            engine.release()

    report_path = rknn_main.with_name(rknn_main.stem + ".report.json")
    report_path.write_text(
        json.dumps(
            {
                "toolkit_version": toolkit_version(),
                "target": args.target,
                "graph_layout": layouts,
                "pass_frames": passes,
                "regtask_warnings": {role: engine.report.regtask_warnings for role, engine in engines.items()},
                "register_overflow_allowed": args.allow_register_overflow,
                "placement": {role: engine.report.placement for role, engine in engines.items()},
                "cpu_ops_allowed": args.allow_cpu_ops,
                "peak_rss_mb": peak_rss_mb,
                "step_frames": {role: contract.step_frames for role, contract in contracts.items()},
                "dynamic_input": dynamic_input_sizes(engines, contracts),
                "engines": {role: vars(engine.report) for role, engine in engines.items()},
                "simulator_check": check,
            },
            indent=2,
        )
    )
    if overflow and not args.allow_register_overflow:
        raise RegisterOverflowError(overflow, report_path)
    if off_npu and not args.allow_cpu_ops:
        raise CpuOpsError(off_npu, args.target, report_path)
    if not check["passed"]:
        raise SimulatorCheckError(check["verdict"], report_path)
    formulation = {"graph_layout": layouts, "pass_frames": passes}
    plan, plan_path = write_plan(args, graphs, contracts, engines, check, formulation)
    return ConvertResult(plan, plan_path, report_path, check)


def shared_graph_roles(
    args: ConvertRequest, graphs: dict[str, Path], contracts: dict, main_layout: str
) -> tuple[dict, dict]:
    """A dynamic main graph with ``--first-codes-length`` serves ``first`` too: both roles name it, each at its B.

    A dynamic graph's own contract says its largest B, which ``main`` runs; ``main_layout`` is its layout.
    """
    main = contracts["main"]
    if not main.dynamic:
        return graphs, contracts
    if main_layout != NPU_LAYOUT:
        raise ConvertUsageError(
            f"{graphs['main'].name} is a dynamic graph in the CPU form; the NPU compiles the {NPU_LAYOUT} one: "
            "export it with --dynamic-input (or let `python -m vllm_omni.edge build --hardware rockchip_npu` do it)"
        )
    if "first" in graphs:
        raise ConvertUsageError(f"{graphs['main']} takes any B up to {main.max_step_frames}: give no --first-onnx")
    if args.first_codes_length is None:
        raise ConvertUsageError(
            f"{graphs['main'].name} takes any B up to {main.max_step_frames} (a dynamic graph); the NPU compiles it "
            "for a set of step sizes: give --first-codes-length for the first step (main runs its largest B)"
        )
    if not 1 <= args.first_codes_length < main.max_step_frames:
        raise ConvertUsageError(
            f"--first-codes-length must be 1..{main.max_step_frames - 1} for {graphs['main'].name} (its main step "
            f"takes {main.max_step_frames}), found {args.first_codes_length}"
        )
    first = main.for_frames(args.first_codes_length)
    return graphs | {"first": graphs["main"]}, contracts | {"first": first}


def unexpected_cpu_ops(placement: dict | None, target: str) -> dict[str, dict]:
    """The op kinds of ``placement`` (an engine report's) on the CPU that ``target`` does not expect there,
    and the ops without a lowering (as ``"<op> (no lowering)"``)."""
    if placement is None:  # an engine that read no placement (a stand-in): nothing to judge
        return {}
    return Placement(**placement).unexpected(target)


def describe_placement(placement: dict | None) -> str:
    return "op placement not read" if placement is None else Placement(**placement).describe()


def peak_rss_so_far_mb() -> int:
    """Peak resident memory of this process (and any toolkit child), in MB: Linux reports ``ru_maxrss`` in KiB."""
    usage = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(max(usage) / 1024)
