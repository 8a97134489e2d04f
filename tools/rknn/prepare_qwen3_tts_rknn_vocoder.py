"""Prepare the Qwen3-TTS vocoder (Code2Wav) stateful step graph for a Rockchip NPU.

Full path, in the converter venv (``make setup-rknn``): export the ONNX step graph(s), compile
them to fp16 ``.rknn``, check them in the toolkit's PC simulator, write ``exec_plan.json``::

    .venv-rknn/bin/python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --model-dir CKPT \
        --codes-length 16 --first-codes-length 2 --target rk3588 --output out/rknn/step_b16.rknn
    .venv-rknn/bin/python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --onnx step_b16.onnx \
        --output out/rknn/step_b16.rknn                      # compile an existing step graph alone

ONNX only (either venv)::

    python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --model-dir CKPT --codes-length 16 \
        --skip-rknn --output out/step_b16.onnx               # ONNX step graph, self-checked
    python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --model-dir CKPT --codes-length 16 \
        --check-only --output out/step_b16.onnx              # re-run the self-check of a graph

``--model-dir`` defaults to $QWEN3_TTS_MODEL. The simulator check streams at least 3 steps from
a zero cache (the first step through the ``first`` graph when there is one, the rest through
``main``, one shared cache) and compares with onnxruntime on the same graphs and, when the
checkpoint is at hand, with the full decode. The fp16 bar is 40 dB against the full decode
(against onnxruntime with ``--onnx`` alone). Exit codes: 2 bad arguments, 1 a failed stage, 4 the
simulator check missed the bar (its ``accuracy_analysis`` is kept beside the output).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from vllm_omni.edge.backends.rknn import (  # noqa: E402
    TARGETS,
    BuiltEngine,
    RknnBuildError,
    build_engine,
    require_toolkit,
    toolkit_version,
)
from vllm_omni.edge.plan import DEFAULT_DEVICE_DIR  # noqa: E402

SIMULATOR_BAR_DB = 40.0


class UsageError(Exception):
    """Bad arguments: reported in one line, exit code 2."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir",
        default=os.environ.get("QWEN3_TTS_MODEL"),
        help="checkpoint dir or hub id (default: $QWEN3_TTS_MODEL)",
    )
    parser.add_argument("--onnx", type=Path, help="compile this existing step graph (B, N, head_dim read from it)")
    parser.add_argument("--first-onnx", type=Path, help="with --onnx: an existing small first-step graph")
    parser.add_argument("--codes-length", type=int, default=16, help="frames per step (B)")
    parser.add_argument("--first-codes-length", type=int, help="also make a small first-step graph of B1 frames")
    parser.add_argument("--target", choices=TARGETS, default="rk3588")
    parser.add_argument("--opt-level", type=int, choices=(0, 1, 2, 3), default=3, help="rknn optimization_level")
    parser.add_argument("--output", type=Path, required=True, help=".rknn (the ONNX goes beside it) or .onnx")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--skip-rknn", action="store_true", help="stop after the ONNX step graph")
    parser.add_argument("--check-only", action="store_true", help="only run the self-check of an existing graph")
    parser.add_argument("--device-dir", default=DEFAULT_DEVICE_DIR, help="where the artifacts go on the board")
    parser.add_argument("--check-steps", type=int, default=3, help="main steps in the simulator check (>= 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    from vllm_omni.edge.errors import EdgeError

    try:
        return run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (EdgeError, RknnBuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def say(message: str) -> None:
    print(f"[rknn] {message}", file=sys.stderr, flush=True)


def onnx_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    base = args.output if args.output.suffix == ".onnx" else args.output.with_suffix(".onnx")
    first = base.with_name(f"{base.stem}_first_b{args.first_codes_length}.onnx") if args.first_codes_length else None
    return base, first


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the output directory {directory}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK):
        raise UsageError(f"the output directory {directory} is not writable; choose another --output")


def run(args: argparse.Namespace) -> int:
    if args.codes_length < 1 or (args.first_codes_length is not None and args.first_codes_length < 1):
        raise UsageError("--codes-length and --first-codes-length must be >= 1")
    if args.check_steps < 3:
        raise UsageError(f"--check-steps must be >= 3 (the check streams through the cache), found {args.check_steps}")
    compile_rknn = not (args.skip_rknn or args.check_only)
    if args.onnx is None and not args.model_dir:
        raise UsageError("no checkpoint: pass --model-dir DIR_OR_HUB_ID, set QWEN3_TTS_MODEL, or give --onnx FILE")
    if compile_rknn and args.output.suffix not in (".rknn", ".onnx"):
        raise UsageError(f"--output must end in .rknn (or .onnx), found {args.output.name}")
    if compile_rknn:
        require_toolkit()  # before any export work: say how to make the converter venv
    check_writable(args.output.parent)

    decoder = None
    if args.model_dir:
        from vllm_omni.edge.decoder_export import load_code2wav_decoder

        decoder = load_code2wav_decoder(args.model_dir)
    graphs = existing_graphs(args) if args.onnx else export_graphs(args, decoder)
    if not compile_rknn:
        return 0
    return compile_and_check(args, graphs, decoder)


def existing_graphs(args: argparse.Namespace) -> dict[str, Path]:
    graphs = {"main": args.onnx}
    if args.first_onnx:
        graphs["first"] = args.first_onnx
    for path in graphs.values():
        if not path.is_file():
            raise UsageError(f"no ONNX file at {path}")
    return graphs


def export_graphs(args: argparse.Namespace, decoder) -> dict[str, Path]:
    from vllm_omni.edge.backends.onnx import check_step_graph, export_step_onnx, graph_contract

    main_path, first_path = onnx_paths(args)
    graphs = {"main": main_path} | ({"first": first_path} if first_path else {})
    sizes = {"main": args.codes_length, "first": args.first_codes_length}
    for role, path in graphs.items():
        if args.check_only:
            snr = check_step_graph(decoder, path)
            print(f"{path}: onnxruntime stepwise vs full decode {snr:.1f} dB")
            continue
        export_step_onnx(decoder, sizes[role], path, opset=args.opset)
        contract = graph_contract(path)
        print(
            f"{path}: B={contract.step_frames} N={contract.cache_numel} head_dim={contract.head_dim} "
            f"({path.stat().st_size / 1e6:.1f} MB)"
        )
    return graphs


def compile_and_check(args: argparse.Namespace, graphs: dict[str, Path], decoder) -> int:
    from vllm_omni.edge.backends.onnx import graph_contract, op_report
    from vllm_omni.edge.step_contract import StepContractError

    contracts = {}
    for role, path in graphs.items():
        try:
            contracts[role] = graph_contract(path)
        except StepContractError as exc:
            raise UsageError(f"--onnx {path} is not a Qwen3-TTS stateful step graph: {exc}") from exc
        report = op_report(path)
        if report.risky:
            say(
                f"warning: {path.name} has ops on the RKNN risk list ({', '.join(sorted(report.risky))}); "
                f"rknn-toolkit2 2.3.x aborted on such graphs, 2.5.0 converted them in a probe; installed: "
                f"{toolkit_version()}"
            )
    if "first" in contracts and not contracts["first"].shares_cache_with(contracts["main"]):
        raise UsageError("the first and main graphs do not share a cache layout; export both from one checkpoint")
    rknn_main = args.output if args.output.suffix == ".rknn" else args.output.with_suffix(".rknn")
    outputs = {"main": rknn_main}
    if "first" in graphs:
        outputs["first"] = rknn_main.with_name(graphs["first"].with_suffix(".rknn").name)

    engines: dict[str, BuiltEngine] = {}
    try:
        for role, path in graphs.items():
            contract = contracts[role]
            say(f"compiling {path.name} (B={contract.step_frames}, N={contract.cache_numel}) for {args.target}, fp16")
            engines[role] = build_engine(
                path,
                outputs[role],
                target=args.target,
                opt_level=args.opt_level,
                simulate=True,
                inputs=contract.input_shapes(),
                outputs=contract.output_shapes(),
            )
            report = engines[role].report
            say(
                f"  {outputs[role].name}: {report.size_bytes / 1e6:.1f} MB in {report.build_seconds:.1f} s; "
                f"REGTASK bit-width warnings: {report.regtask_warnings} (log: {report.log_path})"
            )
        check = simulator_check(args, graphs, contracts, engines, decoder)
    finally:
        for engine in engines.values():
            engine.release()

    report_path = rknn_main.with_name(rknn_main.stem + ".report.json")
    report_path.write_text(
        json.dumps(
            {
                "toolkit_version": toolkit_version(),
                "target": args.target,
                "engines": {role: vars(engine.report) for role, engine in engines.items()},
                "simulator_check": check,
            },
            indent=2,
        )
    )
    if not check["passed"]:
        print(f"error: {check['verdict']} (report: {report_path})", file=sys.stderr)
        return 4
    plan, plan_path = write_plan(args, graphs, contracts, engines, check)
    print(f"simulator check: {check['verdict']}")
    print(f"report: {report_path}\nexec plan: {plan_path}")
    print_deploy(args, plan, plan_path)
    return 0


def simulator_check(args, graphs, contracts, engines, decoder) -> dict:
    """Stream >= 3 steps through the simulator from a zero cache; compare with onnxruntime and the full decode."""
    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.runtime import StatefulDecoder
    from vllm_omni.edge.runtime.onnx_step import OnnxStepRunner
    from vllm_omni.edge.runtime.rknn_step import RknnSimulatorStepRunner

    main = contracts["main"]
    first_frames = contracts["first"].step_frames if "first" in contracts else 0
    frames = first_frames + args.check_steps * main.step_frames
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, main.codebook_size, size=(frames, main.num_quantizers), dtype=np.int64)
    boundaries = ([first_frames] if first_frames else []) + [main.step_frames] * args.check_steps

    def stream(runners: dict) -> np.ndarray:
        decoder_ = StatefulDecoder(runners["main"], runners.get("first"))
        return np.concatenate([decoder_.feed(codes), decoder_.flush()])

    started = time.perf_counter()
    simulated_runners = {
        role: RknnSimulatorStepRunner(graphs[role], contracts[role], args.target, engine=engines[role])
        for role in engines
    }
    simulated = stream(simulated_runners)
    sim_seconds = time.perf_counter() - started
    reference_ort = stream({role: OnnxStepRunner(path) for role, path in graphs.items()})
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
        span = slice(start * main.hop, (start + size) * main.hop)
        per_step.append(round(snr_db(reference[span], simulated[span]), 1))
        start += size
    result["per_step_snr_db"] = per_step
    result["max_abs_diff"] = float(np.abs(reference - simulated).max())
    overall = snr_db(reference, simulated)
    result["passed"] = overall >= SIMULATOR_BAR_DB
    result["verdict"] = (
        f"simulator vs {against}: {overall:.1f} dB over {len(boundaries)} steps (per step {per_step}); "
        f"bar {SIMULATOR_BAR_DB:.0f} dB: {'passed' if result['passed'] else 'MISSED'}"
    )
    say(result["verdict"])
    if not result["passed"]:
        result["accuracy_analysis"] = analyse_accuracy(
            args, engines["first" if first_frames else "main"], simulated_runners["first" if first_frames else "main"]
        )
    return result


def analyse_accuracy(args, engine: BuiltEngine, runner) -> dict:
    """Run ``accuracy_analysis`` on the first step's inputs; name the first layer whose cosine drops."""
    import numpy as np

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


def write_plan(args, graphs, contracts, engines, check):
    from vllm_omni.edge.plan import StepArtifact, stateful_plan

    model = {"id": str(args.model_dir or args.onnx), "checkpoint_sha256": None}
    if args.model_dir:
        from vllm_omni.edge.checkpoint import checkpoint_sha256, resolve_speech_tokenizer

        model["checkpoint_sha256"] = checkpoint_sha256(resolve_speech_tokenizer(args.model_dir))
    verification = {
        "runtime": "rknn-toolkit2 simulator",
        "against": "full decode" if "snr_db_vs_full_decode" in check else "onnxruntime",
        "snr_db": check.get("snr_db_vs_full_decode", check["snr_db_vs_onnxruntime"]),
    }
    directory = args.output.parent
    sources = {}
    for role, path in graphs.items():  # the plan directory is self-contained: its ONNX sources sit in it
        sources[role] = directory / path.name
        if path.resolve() != sources[role].resolve():
            import shutil

            say(f"copying {path} beside the plan (the simulator and CPU fallbacks compile from it)")
            shutil.copyfile(path, sources[role])
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
            "simulator_check": {key: check[key] for key in ("frames", "steps", "per_step_snr_db", "verdict")},
        },
    )
    return plan, plan.write(directory)


def print_deploy(args, plan, plan_path: Path) -> None:
    from vllm_omni.edge.plan import session_option

    files = " ".join(str(plan.path(role)) for role in plan.artifacts)
    print("deploy (adb; or scp to the board):")
    print(f"  adb shell mkdir -p {args.device_dir} && adb push {files} {plan_path} {args.device_dir}/")
    print(f"  --session-option '{session_option(plan)}'")


if __name__ == "__main__":
    raise SystemExit(main())
