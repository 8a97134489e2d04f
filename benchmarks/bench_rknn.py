"""RKNN fp16 step graphs: register-overflow (REGTASK) count, compile cost and simulator SNR, per target and B.

    .venv-rknn/bin/python -m benchmarks.bench_rknn --out out/bench [--geometry released]
        [--targets rk3588 rk3576] [--steps 16 64] [--first 2] [--check-steps 20] [--only ROW ...]

RANDOM WEIGHTS. Two checkpoints (:mod:`vllm_omni.testing.drive`): ``hot`` (make_checkpoint's
weights, output RMS about 0.07, SnakeBeta driven hard) and ``moderate`` (seed 1, the waveform
blocks' convs x0.5, final conv rescaled to a loud output). The ONNX step graphs (NPU layout,
``time_on_height``) are exported once per checkpoint and B; then, one converter process per row
(``vllm-omni-edge rknn-convert --onnx ... --model-dir ...``), each is compiled for
its target in fp16 and streamed ``--check-steps`` steps through the simulator against the full
decode (the main rows mix the ``--first`` graph in: step 0 and every fifth). Rows, in order of
importance: ``hot`` main+first on each target, ``moderate`` main+first on the first target, the
same two as one ``.rknn`` for both sizes (``-one-rknn``: one graph at a symbolic B compiled with
``dynamic_input``, what the builder ships), then each further B alone on each target. Reports per
row: compile seconds, peak RSS of the converter,
``.rknn`` MB, REGTASK count (every graph of the row), simulator SNR (overall, min/mean per step),
onnxruntime SNR vs the full decode, output RMS. ``rknn.json`` is rewritten after every row and
keeps the rows of earlier runs into the same ``--out`` that this run does not redo, so rows can run
one invocation at a time (``--only``).
rk3576 rows decode steps longer than 16 frames in passes, as the builder does (``MAX_PASS_FRAMES``).
After the rows, each graph is also streamed in onnxruntime against the full decode in fp32 and in
fp64 (``--reference-frames``), which tells the graph's error from the fp32 reference's own.
A released row takes minutes and several GB (rk3576 at B=64: about an hour and 18 GB with its
20-step simulator check): run under the shared lock, one at a time. Exported graphs are kept in
``--out`` and reused: remove its ``onnx-*`` folders after changing the step graph's code.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import ensure_checkpoint, run_cli, table, write_json
from vllm_omni.edge.builders.rknn.build import MAX_PASS_FRAMES

CONVERTER = ["-m", "vllm_omni.edge", "rknn-convert"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--targets", nargs="+", default=["rk3588", "rk3576"])
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 64], help="main step sizes B")
    parser.add_argument("--first", type=int, default=2, help="first-step size mixed into the B=steps[0] rows")
    parser.add_argument("--check-steps", type=int, default=20)
    parser.add_argument(
        "--matrix-check-steps",
        type=int,
        help="check steps of the rows after the two accuracy rows (default: --check-steps)",
    )
    parser.add_argument("--only", nargs="+", help="run only these rows (names as printed)")
    parser.add_argument(
        "--reference-frames",
        type=int,
        default=320,
        help="frames streamed through each ONNX graph in onnxruntime against the fp32 and the fp64 full decode "
        "(how much of the onnxruntime SNR is the fp32 reference's own noise); 0 skips it",
    )
    parser.add_argument(
        "--reference-only", action="store_true", help="only the fp32/fp64 reference comparison of the rows' graphs"
    )
    parser.add_argument(
        "--compare-one-rknn",
        type=int,
        default=0,
        metavar="UTTERANCES",
        help="after the rows: the hot checkpoint on the first target through the one-.rknn build and through the "
        "two static files, in the simulator, on the same utterances (a first step, then four main steps each); "
        "reports the difference of their audio",
    )
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    checkpoints = {
        drive: ensure_checkpoint(
            args.out / f"checkpoint-{args.geometry}-{drive}", args.geometry, seed=seed, drive=drive
        )
        for drive, seed in (("hot", 0), ("moderate", 1))
    }

    main_b, others = args.steps[0], args.steps[1:]
    plan = [(f"hot-{t}-b{main_b}+{args.first}", "hot", t, main_b, args.first) for t in args.targets]
    plan.insert(
        1, (f"moderate-{args.targets[0]}-b{main_b}+{args.first}", "moderate", args.targets[0], main_b, args.first)
    )
    # What `build --hardware rockchip_npu` ships: one .rknn (dynamic_input) for both sizes, where no passes are needed.
    plan[2:2] = [
        (f"{name}-one-rknn", drive, target, size, first)
        for name, drive, target, size, first in plan[:2]
        if size <= MAX_PASS_FRAMES.get(target, size)
    ]
    plan += [(f"hot-{t}-b{b}", "hot", t, b, None) for b in others for t in args.targets]
    if args.only:
        plan = [row for row in plan if row[0] in args.only]

    result_path = args.out / "rknn.json"
    result = {"benchmark": "rknn fp16 compile + simulator", "weights": "RANDOM WEIGHTS", "geometry": args.geometry,
              "check_steps": args.check_steps}  # fmt: skip
    # Rows and reference entries of earlier runs into this --out that this run does not redo are kept.
    earlier = previous_result(result_path, args.geometry)
    redone = set() if args.reference_only else {row[0] for row in plan}
    result["rows"] = [row for row in earlier.get("rows", []) if isinstance(row, dict) and row.get("row") not in redone]
    result["fp32_reference"] = [entry for entry in earlier.get("fp32_reference", []) if isinstance(entry, dict)]
    accuracy_rows = {row[0] for row in plan[:2]}
    for name, drive, target, size, first in [] if args.reference_only else plan:
        steps = args.check_steps if name in accuracy_rows else (args.matrix_check_steps or args.check_steps)
        passes = MAX_PASS_FRAMES.get(target)  # what `build --hardware rockchip_npu` exports for this target
        out_dir = args.out / f"rknn-{args.geometry}-{name}"
        out_dir.mkdir(parents=True, exist_ok=True)
        if name.endswith("-one-rknn"):  # one graph at a symbolic B, compiled once for both sizes
            graph = export(args, checkpoints[drive], drive, size, first_step_frames=first)
            output = out_dir / graph.with_suffix(".rknn").name
            command = [sys.executable, *CONVERTER, "--onnx", str(graph), "--model-dir", str(checkpoints[drive])]
            command += ["--first-codes-length", str(first)]
        else:
            graphs = {
                role: export(args, checkpoints[drive], drive, b, passes)
                for role, b in (("main", size), ("first", first))
                if b
            }
            output = out_dir / f"step_b{size}.rknn"
            command = [sys.executable, *CONVERTER, "--onnx", str(graphs["main"])]
            command += ["--model-dir", str(checkpoints[drive])]
            command += ["--first-onnx", str(graphs["first"])] if "first" in graphs else []
        command += ["--target", target, "--check-steps", str(steps), "--output", str(output)]
        print(f"[bench] {name}: {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        (out_dir / "convert.log").write_text(completed.stdout + completed.stderr)
        report_path = output.with_name(output.stem + ".report.json")
        if not report_path.exists():
            print(f"[bench]   {name} failed (exit {completed.returncode}); see {out_dir / 'convert.log'}", flush=True)
            result["rows"].append({"row": name, "exit_code": completed.returncode, "failed": True})
            write_json(result_path, result)
            continue
        report = json.loads(report_path.read_text())
        check = report["simulator_check"]
        result["rows"].append(
            {
                "row": name,
                "check_steps": steps,
                "checkpoint": drive,
                "target": target,
                "step_frames": report["step_frames"],
                "dynamic_input": report.get("dynamic_input") or None,  # {.rknn: [B, ...]} of a one-file row
                "exit_code": completed.returncode,
                "wall_seconds": round(seconds, 1),
                "compile_seconds": {role: engine["build_seconds"] for role, engine in report["engines"].items()},
                "peak_rss_mb": report["peak_rss_mb"],
                "rknn_mb": {role: round(engine["size_bytes"] / 1e6, 1) for role, engine in report["engines"].items()},
                "regtask_warnings": report["regtask_warnings"],
                "graph_layout": report["graph_layout"],
                "pass_frames": report.get("pass_frames"),
                "simulator_snr_db_vs_full": check.get("snr_db_vs_full_decode"),
                "min_step_snr_db": check["min_step_snr_db"],
                "mean_step_snr_db": check["mean_step_snr_db"],
                "per_step_snr_db": check["per_step_snr_db"],
                "onnxruntime_snr_db_vs_full": check.get("onnxruntime_snr_db_vs_full_decode"),
                "output_rms": check.get("output_rms"),
                "simulator_seconds": check["simulator_seconds"],
                "toolkit_version": report["toolkit_version"],
            }
        )
        print(f"[bench]   {json.dumps(result['rows'][-1])}", flush=True)
        write_json(result_path, result)
    if args.reference_frames:
        entries = {entry.get("graph"): entry for entry in result["fp32_reference"]}
        # the static graphs (a one-file row's graph equals them per size: tests/edge/graphs/test_npu_layout.py)
        used = {(row[1], b, MAX_PASS_FRAMES.get(row[2])) for row in plan for b in (row[3], row[4]) if b}
        graphs = {export(args, checkpoints[drive], drive, size, passes): drive for drive, size, passes in used}
        for graph, drive in sorted(graphs.items()):
            name = f"{drive}-{graph.stem.removeprefix('step_')}"
            print(f"[bench] fp32 reference noise: {name}", flush=True)
            entries[name] = {"graph": name, **reference_noise(checkpoints[drive], graph, args)}
        result["fp32_reference"] = sorted(entries.values(), key=lambda entry: str(entry.get("graph")))
        write_json(result_path, result)
    if args.compare_one_rknn:
        result["one_rknn_vs_two_files"] = compare_one_rknn(args, checkpoints["hot"], args.targets[0], main_b)
        write_json(result_path, result)
    print_table(result)
    print(f"-> {result_path}")
    return 0


def compare_one_rknn(args, checkpoint: Path, target: str, size: int) -> dict:
    """The one-``.rknn`` build against the two static files, in the simulator, step by step on the same input.

    Each build is compiled (the converter's ``build_engine``), streamed through ``--compare-one-rknn``
    utterances of ``first + 4 * size`` random frames (a reset between them), then released, so only
    one build is in memory at a time.
    """
    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.backends.onnx.graph import graph_contract
    from vllm_omni.edge.backends.rknn.run import RknnSimulatorStepRunner, SimulatedModel
    from vllm_omni.edge.runtime.stateful_decoder import StatefulDecoder

    first = args.first
    dynamic = export(args, checkpoint, "hot", size, first_step_frames=first)
    statics = {b: export(args, checkpoint, "hot", b) for b in (first, size)}
    contracts = {path: graph_contract(path) for path in (dynamic, *statics.values())}  # one read of each graph
    rng = np.random.default_rng(7)
    utterances = [rng.integers(0, 2048, size=(first + 4 * size, 16)) for _ in range(args.compare_one_rknn)]

    def stream(models: dict[int, tuple[Path, SimulatedModel]]) -> list[np.ndarray]:
        runners = {
            b: RknnSimulatorStepRunner(path, contracts[path].for_frames(b), target, engine=model)
            for b, (path, model) in models.items()
        }
        decoder = StatefulDecoder(runners[size], first=runners[first])
        audio = []
        for frames in utterances:
            audio.append(decoder.feed(frames))
            decoder.reset()
        return audio

    print(f"[bench] one .rknn vs two files: compiling {dynamic.name} for {target} (B={first}/{size})", flush=True)
    shared = SimulatedModel(dynamic, [contracts[dynamic].for_frames(b) for b in (first, size)], target)
    one = stream({first: (dynamic, shared), size: (dynamic, shared)})
    del shared
    print(f"[bench] one .rknn vs two files: compiling {', '.join(p.name for p in statics.values())}", flush=True)
    two = stream({b: (path, SimulatedModel(path, [contracts[path]], target)) for b, path in statics.items()})
    one_audio, two_audio = np.concatenate(one), np.concatenate(two)
    entry = {
        "target": target,
        "checkpoint": "hot",
        "utterances": len(utterances),
        "steps_per_utterance": f"B={first}, then 4 x B={size}",
        "samples": int(one_audio.size),
        "max_abs_difference": float(np.abs(one_audio - two_audio).max()),
        "bit_identical": bool(np.array_equal(one_audio, two_audio)),
        "snr_db_one_vs_two": float(snr_db(two_audio, one_audio)) if not np.array_equal(one_audio, two_audio) else None,
    }
    print(f"[bench]   {json.dumps(entry)}", flush=True)
    return entry


def reference_noise(checkpoint: Path, graph: Path, args) -> dict:
    """The graph in onnxruntime (fp32) against the fp32 and the fp64 eager full decode, and those two apart.

    If the graph reads higher against fp64 than the fp32 decode does, its SNR against the fp32 decode
    is bounded by that decode's own rounding, not by the graph.
    """
    import copy

    import numpy as np
    import torch

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.backends.onnx.run import OnnxStepRunner
    from vllm_omni.edge.builders.rknn.check import stream_steps
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    decoder = load_code2wav_decoder(checkpoint)
    runner = OnnxStepRunner(graph)
    contract = runner.contract
    steps = max(1, args.reference_frames // contract.step_frames)
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, contract.codebook_size, (steps * contract.step_frames, contract.num_quantizers))
    stepped = stream_steps({"main": runner}, {"main": contract}, codes, ["main"] * steps)
    frames = torch.from_numpy(codes.T[None].copy())
    exact = copy.deepcopy(decoder).double()
    exact.precompute_snake_caches()  # the folded SnakeBeta constants, computed in fp64 too
    with torch.inference_mode():
        fp32, fp64 = decoder(frames)[0, 0].numpy(), exact(frames)[0, 0].numpy()
    return {
        "frames": int(codes.shape[0]),
        "onnxruntime_vs_fp32_db": round(snr_db(fp32, stepped), 1),
        "fp32_vs_fp64_db": round(snr_db(fp64, fp32), 1),
        "onnxruntime_vs_fp64_db": round(snr_db(fp64, stepped), 1),
    }


def previous_result(result_path: Path, geometry: str) -> dict:
    """What an earlier run (``--only``) wrote to ``rknn.json`` at this geometry; ``{}`` if nothing usable."""
    try:
        earlier = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return {}
    return earlier if isinstance(earlier, dict) and earlier.get("geometry") == geometry else {}


def export(
    args, checkpoint: Path, drive: str, size: int, pass_frames: int | None = None, first_step_frames: int | None = None
) -> Path:
    """The checked ONNX step graph (NPU layout) of ``size`` frames for ``checkpoint``; exported once.

    With ``pass_frames`` below ``size`` the graph decodes in passes (its own file, ``step_bB-pP.onnx``);
    with ``first_step_frames`` it is one graph at a symbolic B for both sizes (``step_bB1_bB.onnx``).
    """
    passes = pass_frames is not None and pass_frames < size
    name = f"step_b{size}-p{pass_frames}.onnx" if passes else f"step_b{size}.onnx"
    if first_step_frames:
        name = f"step_b{first_step_frames}_b{size}.onnx"
    path = args.out / f"onnx-{args.geometry}-{drive}" / name
    if not path.is_file():
        command = [sys.executable, *CONVERTER, "--model-dir", str(checkpoint), "--codes-length", str(size)]
        command += ["--skip-rknn", "--output", str(path)] + (["--pass-frames", str(pass_frames)] if passes else [])
        command += ["--first-codes-length", str(first_step_frames), "--dynamic-input"] if first_step_frames else []
        print(f"[bench] export {drive} B={size}", flush=True)
        subprocess.run(command, check=True, capture_output=True, text=True)
    return path


def print_table(result: dict) -> None:
    print(f"\n{result['geometry']} geometry, {result['weights']}, fp16, simulator, {result['check_steps']} steps")
    headers = ("row", "B", "compile s", "peak RSS MB", ".rknn MB", "REGTASK", "sim SNR dB (min / mean step)")
    rows = []
    for row in result["rows"]:
        if row.get("failed"):
            rows.append((row["row"], f"failed (exit {row['exit_code']})", *[None] * 7))
            continue
        snr = f"{row['simulator_snr_db_vs_full']:.1f} ({row['min_step_snr_db']:.1f} / {row['mean_step_snr_db']:.1f})"
        rows.append(
            (
                row["row"], row["step_frames"], row["compile_seconds"], row["peak_rss_mb"], row["rknn_mb"],
                row["regtask_warnings"], snr, f"{row['onnxruntime_snr_db_vs_full']:.1f}", f"{row['output_rms']:.3f}",
            )
        )  # fmt: skip
    print(table((*headers, "ORT SNR dB", "RMS"), rows))
    if result.get("fp32_reference"):
        print("\nstep graph in onnxruntime vs the eager full decode in fp32 and in fp64 (SNR dB)")
        headers = ("graph", "frames", "onnxruntime vs fp32", "fp32 vs fp64", "onnxruntime vs fp64")
        rows = [
            (
                entry["graph"], entry["frames"], entry["onnxruntime_vs_fp32_db"], entry["fp32_vs_fp64_db"],
                entry["onnxruntime_vs_fp64_db"],
            )
            for entry in result["fp32_reference"]
        ]  # fmt: skip
        print(table(headers, rows))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
