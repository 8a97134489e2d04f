"""Compile the stateful step graph(s) to fp16 ``.rknn``, check them in the simulator, write the plan.

Runs where rknn-toolkit2 is installed, the converter venv (``make setup-rknn``); its command line
is :mod:`vllm_omni.edge.cli.rknn_convert`::

    .venv-rknn/bin/python -m vllm_omni.edge.cli.rknn_convert --model-dir CKPT --codes-length 16 \
        --first-codes-length 2 --dynamic-input --target rk3588 --output out/rknn/step_b2_b16.rknn
    .venv-rknn/bin/python -m vllm_omni.edge.cli.rknn_convert --onnx step_b16.onnx \
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
given (the ``rockchip_npu`` builder never gives it); the count is in the report and the plan.
Likewise the op placement the toolkit prints (which ops run on the CPU, which have no lowering)
goes into the report and the plan's ``build.placement``, and a build that places an op kind on
the CPU that :data:`~vllm_omni.edge.backends.rknn.EXPECTED_CPU_OPS` does not name, or any op
without a lowering, fails with :class:`CpuOpsError` unless ``--allow-cpu-ops`` is given (the
``rockchip_npu`` builder never gives it either).

The simulator check streams ``--check-steps`` (default 20) steps from a zero cache through one
shared cache, mixing the ``first`` graph (when there is one: the first step and every fifth) with
``main``, and compares with onnxruntime on the same graphs and, when the checkpoint is at hand,
with the full decode, step by step. The fp16 bar is 40 dB SNR against the full decode (against
onnxruntime with ``--onnx`` alone), or a peak error at or below -40 dBFS for a near-silent
checkpoint (:class:`~vllm_omni.edge.audio.ReferenceMatch`); missing it raises
:class:`SimulatorCheckError` and keeps ``accuracy_analysis`` beside the output.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import match_reference, snr_db
from ..backends.onnx import graph_contract, graph_formulation, op_report
from ..backends.onnxruntime import OnnxStepGraph
from ..backends.rknn import (
    BuiltEngine,
    Placement,
    RknnBuildError,
    build_engine,
    expected_cpu_ops,
    require_toolkit,
    toolkit_version,
)
from ..backends.rknn_runtime import RknnSimulatorStepRunner, shape_sets
from ..checkpoint import checkpoint_sha256, load_code2wav_decoder, model_label, resolve_speech_tokenizer
from ..errors import EdgeError, EdgeExportError
from ..graphs.layouts import NPU_LAYOUT, layouts_for
from ..graphs.step_contract import StepContractError
from ..plan.construct import StepArtifact, stateful_plan
from ..plan.model import DEFAULT_DEVICE_DIR, ExecPlan
from ..progress import progress_printer
from ..runtime.stateful_decoder import rope_angles
from .steps import check_step_graph, export_checked_step

logger = logging.getLogger(__name__)

SIMULATOR_BAR_DB = 40.0
FIRST_STEP_EVERY = 5  # the check's schedule: a first-size step at step 0, 5, 10, ... (one shared cache)
# What a failed conversion reports in its JSON outcome (``status``), and how the builder says it.
OUTCOME_REASONS = {
    "usage": "the converter refused its arguments",
    "below_bar": "the simulator check missed its bar",
    "failed": "a conversion stage failed",
    "register_overflow": "the toolkit overflowed NPU register fields (REGTASK warnings)",
    "cpu_ops": "the toolkit placed ops on the CPU that the allow-list does not name, or found no lowering for ops",
}


class ConvertUsageError(EdgeError):
    """Arguments that cannot make a conversion (sizes, a missing checkpoint, an unwritable output)."""


class RegisterOverflowError(EdgeExportError):
    """The toolkit printed REGTASK bit-width warnings: a board may truncate those fields and play wrong audio."""

    def __init__(self, counts: dict[str, int], report_path: Path):
        self.counts, self.report_path = counts, report_path
        found = ", ".join(f"{role}: {count:,}" for role, count in counts.items())
        super().__init__(
            f"REGTASK 'bit width of field value exceeds the limit' warnings: expected 0, found {found} "
            f"(report: {report_path}). Export the graph with --graph-layout {NPU_LAYOUT} (the rockchip_npu "
            "builder does), or pass --allow-register-overflow to keep a simulator-only artifact"
        )


class CpuOpsError(EdgeExportError):
    """The toolkit placed op kinds off the NPU that ``EXPECTED_CPU_OPS`` does not name, or found no lowering.

    ``unexpected``: per role, per op kind ``{"count", "nodes", "reason"}`` (an op without a lowering is
    the kind ``"<op> (no lowering)"``); boards have aborted on such an op at run time.
    """

    def __init__(self, unexpected: dict[str, dict[str, dict]], target: str, report_path: Path):
        self.unexpected, self.report_path = unexpected, report_path
        found = "; ".join(
            f"{role}: " + ", ".join(f"{op} x{entry['count']} ({', '.join(entry['nodes'][:3])}"
                                    f"{', ...' if entry['count'] > 3 else ''})" for op, entry in sorted(kinds.items()))
            for role, kinds in unexpected.items()
        )  # fmt: skip
        super().__init__(
            f"ops off the NPU: expected only {', '.join(sorted(expected_cpu_ops(target)))} on the CPU for {target} "
            f"and every op lowered, found {found} (report: {report_path}). A board may abort on them; pass "
            "--allow-cpu-ops to keep a simulator-only artifact"
        )


class SimulatorCheckError(EdgeExportError):
    """The simulator's audio missed the fp16 bar; the report and ``accuracy_analysis`` stay beside the output."""

    def __init__(self, verdict: str, report_path: Path):
        self.report_path = report_path
        super().__init__(
            f"{verdict} (report: {report_path}). The .rknn is not fit to ship: the report's accuracy_analysis "
            "names the first layer whose fp16 output drifts"
        )


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


say = progress_printer("rknn")


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


def dynamic_input_sizes(engines: dict[str, BuiltEngine], contracts: dict) -> dict[str, list[int]]:
    """``{.rknn file name: [B, ...]}`` of each file compiled with ``dynamic_input`` (for the plan's build record)."""
    sizes: dict[str, list[int]] = {}
    for role, engine in engines.items():
        if engine.report.shape_sets:
            sizes.setdefault(Path(engine.report.path).name, []).append(contracts[role].step_frames)
    return {name: sorted(frames) for name, frames in sizes.items()}


def roles_by_graph(graphs: dict[str, Path]) -> dict[Path, list[str]]:
    """The roles of each graph file, ``main`` before ``first`` (the converter compiles each file once)."""
    roles: dict[Path, list[str]] = {}
    for role, path in graphs.items():
        roles.setdefault(path, []).append(role)
    return roles


def peak_rss_so_far_mb() -> int:
    """Peak resident memory of this process (and any toolkit child), in MB: Linux reports ``ru_maxrss`` in KiB."""
    usage = (resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(max(usage) / 1024)


def check_schedule(contracts: dict, steps: int) -> list[str]:
    """The roles of the check's steps: ``first`` at step 0 and every :data:`FIRST_STEP_EVERY`-th, else ``main``."""
    if "first" not in contracts:
        return ["main"] * steps
    return ["first" if index % FIRST_STEP_EVERY == 0 else "main" for index in range(steps)]


def stream_steps(runners: dict, contracts: dict, codes: np.ndarray, schedule: list[str]) -> np.ndarray:
    """Run ``schedule`` over ``codes`` ([frames, Q]) from a zero cache, one cache shared by all roles."""
    main = contracts["main"]
    inv_freq = np.asarray(main.rope_inv_freq, dtype=np.float32)
    cache = np.zeros(main.cache_numel, dtype=np.float32)
    position, pieces = 0, []
    for role in schedule:
        size = contracts[role].step_frames
        block = np.ascontiguousarray(codes[position : position + size].T[None])
        valid = np.array([min(position, main.kv_slots)], dtype=np.float32)
        audio, cache = runners[role].run(block, rope_angles(position, size, inv_freq), valid, cache)
        cache = np.asarray(cache, dtype=np.float32)
        pieces.append(np.asarray(audio, dtype=np.float32).reshape(-1))
        position += size
    return np.concatenate(pieces)


def simulator_check(args, graphs, contracts, engines, decoder) -> dict:
    """Stream ``check_steps`` mixed first/main steps through the simulator; compare per step with the references."""
    main = contracts["main"]
    schedule = check_schedule(contracts, args.check_steps)
    boundaries = [contracts[role].step_frames for role in schedule]
    frames = sum(boundaries)
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, main.codebook_size, size=(frames, main.num_quantizers), dtype=np.int64)

    started = time.perf_counter()
    simulated_runners = {
        role: RknnSimulatorStepRunner(graphs[role], contracts[role], args.target, engine=engines[role])
        for role in engines
    }
    simulated = stream_steps(simulated_runners, contracts, codes, schedule)
    sim_seconds = time.perf_counter() - started
    sessions = {path: OnnxStepGraph(path) for path in roles_by_graph(graphs)}  # a shared graph loads once
    reference_ort = stream_steps(
        {role: sessions[path].runner(contracts[role].step_frames) for role, path in graphs.items()},
        contracts,
        codes,
        schedule,
    )
    reference, against = reference_ort, "onnxruntime"
    result = {"frames": frames, "steps": boundaries, "simulator_seconds": round(sim_seconds, 2)}
    result["snr_db_vs_onnxruntime"] = snr_db(reference_ort, simulated)
    if decoder is not None:
        import torch

        with torch.inference_mode():
            reference = decoder(torch.from_numpy(codes.T[None].copy()))[0, 0].numpy()
        against = "full decode"
        result["snr_db_vs_full_decode"] = snr_db(reference, simulated)
        result["onnxruntime_snr_db_vs_full_decode"] = snr_db(reference, reference_ort)
    per_step, start = [], 0
    for size in boundaries:
        span = slice(start * main.samples_per_frame, (start + size) * main.samples_per_frame)
        per_step.append(round(snr_db(reference[span], simulated[span]), 1))
        start += size
    result["per_step_snr_db"] = per_step
    result["min_step_snr_db"] = min(per_step)
    result["mean_step_snr_db"] = round(float(np.mean(per_step)), 2)
    result["output_rms"] = float(np.sqrt(np.mean(np.square(reference))))
    overall = match_reference(reference, simulated, SIMULATOR_BAR_DB)
    result["max_abs_diff"] = overall.max_abs
    result["passed"] = overall.passed
    result["verdict"] = (
        f"simulator vs {against}: {overall.describe()} over {len(boundaries)} steps (per step SNR min "
        f"{min(per_step):.1f} / mean {result['mean_step_snr_db']:.1f} dB; output RMS {result['output_rms']:.3g}); "
        f"bar {overall.bar()}: {'passed' if overall.passed else 'MISSED'}"
    )
    say(result["verdict"])
    say(f"per-step SNR dB: {per_step}")
    if not result["passed"]:
        result["accuracy_analysis"] = analyse_accuracy(args, engines[schedule[0]], simulated_runners[schedule[0]])
    return result


def analyse_accuracy(args, engine: BuiltEngine, runner) -> dict:
    """Run ``accuracy_analysis`` on the first step's inputs; name the first layer whose cosine drops."""
    out_dir = args.output.with_name(args.output.stem + ".accuracy")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for index, array in enumerate(runner.step_inputs):
        path = out_dir / f"input_{index}.npy"
        np.save(path, array)
        files.append(str(path))
    try:
        engine.accuracy_analysis(files, out_dir)
    except RknnBuildError as exc:
        return {"dir": str(out_dir), "error": str(exc)}
    first_drift = None
    table = out_dir / "error_analysis.txt"
    if table.is_file():
        for line in table.read_text(errors="replace").splitlines():
            numbers = [float(tok) for tok in line.replace("|", " ").split() if _is_float(tok)]
            if numbers and numbers[0] < 0.999:
                first_drift = line.strip()
                break
    say(f"accuracy_analysis kept in {out_dir}; first layer whose cosine falls below 0.999: {first_drift}")
    return {"dir": str(out_dir), "first_drifting_layer": first_drift}


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def write_plan(args, graphs, contracts, engines, check, formulation: dict):
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
