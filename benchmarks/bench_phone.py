"""npu_phone: windowed vs stateful ExecuTorch plans on the same streams, one process per plan and stream.

    python benchmarks/bench_phone.py --out out/bench_phone --geometry released \
        [--windowed-plan DIR] [--stateful-plan DIR] [--seconds 3 20]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs), so
the SNRs measure the graphs, not the voice. The plans are built with ``python -m vllm_omni.edge
build --hardware npu_phone [--graph stateful]`` (each program verified in the ExecuTorch runtime
during the build); pass their directories, or let this script build them under ``--out``.

Per plan and stream length, in its own process (thread pools of different runtimes fight on 2 cores):
``ExecPlan.load`` + ``open_decoder(plan)`` (open seconds: sha256 of every file, program load,
methods; the Python import of torch + executorch is reported apart), then the stream fed one
frame at a time, as a talker emits them: real-time factor (decode seconds / audio seconds),
first audio (decode seconds until the first PCM comes back, the open excluded), peak RSS, and the
SNR (dB) of the whole stream against the eager full decode (its own process). Program size is the
plan's distinct files.

Writes ``phone.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers import peak_rss_mb, run_worker, time_full_decode


def worker_plan(args) -> dict:
    import numpy as np

    from vllm_omni.edge.plan import ExecPlan
    from vllm_omni.edge.runtime.open import open_decoder

    codes = np.load(args.codes)
    start = time.perf_counter()
    from vllm_omni.edge.backends.executorch import quiet_executorch_import

    with quiet_executorch_import():
        import executorch.runtime  # noqa: F401  (torch + the runtime: a Python cost, not the device's)
    import_seconds = time.perf_counter() - start
    start = time.perf_counter()
    plan = ExecPlan.load(args.plan)
    decoder = open_decoder(plan)
    open_seconds = time.perf_counter() - start
    pieces, first_audio, seconds = [], None, 0.0
    for index in range(len(codes)):
        start = time.perf_counter()
        pcm = decoder.feed(codes[index : index + 1])
        seconds += time.perf_counter() - start
        if pcm.size and first_audio is None:
            first_audio = seconds
        pieces.append(pcm)
    start = time.perf_counter()
    pieces.append(decoder.flush())
    seconds += time.perf_counter() - start
    audio = np.concatenate(pieces)
    np.save(args.audio_out, audio)
    audio_seconds = len(codes) * plan.codec.samples_per_frame / plan.codec.sample_rate
    files = {artifact.file: artifact.size_bytes for artifact in plan.artifacts.values()}
    return {
        "plan": str(args.plan),
        "graph_kind": plan.graph_kind,
        "schedule": (
            f"ramp {plan.windowed['ramp']}, context {plan.windowed['context_frames']}"
            if plan.windowed
            else ", ".join(f"{role} B={plan.step_contract(role).step_frames}" for role in plan.artifacts)
        ),
        "frames": len(codes),
        "audio_seconds": audio_seconds,
        "import_seconds": import_seconds,
        "open_seconds": open_seconds,
        "seconds": seconds,
        "rtf": seconds / audio_seconds,
        "first_audio_seconds": first_audio,
        "peak_rss_mb": peak_rss_mb(),
        "program_bytes": sum(files.values()),
        "files": len(files),
        "methods": len(plan.artifacts),
    }


def build_plan(model: Path, out: Path, graph: str, extra: list[str]) -> Path:
    from vllm_omni.edge.cli.main import main as edge_main

    if not (out / "exec_plan.json").exists():
        print(f"[bench] building npu_phone --graph {graph} into {out}", flush=True)
        command = ["build", "--hardware", "npu_phone", "--graph", graph, "--model", str(model), "--out", str(out)]
        if edge_main([*command, *extra]) != 0:
            raise SystemExit(f"the {graph} build failed")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench_phone"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--model", type=Path, help="checkpoint (default: a random-weight one under --out)")
    parser.add_argument("--windowed-plan", type=Path, help="an npu_phone windowed plan (default: built under --out)")
    parser.add_argument("--stateful-plan", type=Path, help="an npu_phone stateful plan (default: built under --out)")
    parser.add_argument("--build-args", nargs="*", default=[], help="extra build arguments (small: --ramp 2 ...)")
    parser.add_argument("--seconds", type=float, nargs="+", default=[3.0, 20.0], help="stream lengths")
    # worker mode (internal)
    parser.add_argument("--worker", choices=("plan", "full"))
    parser.add_argument("--plan"), parser.add_argument("--codes"), parser.add_argument("--audio-out")
    args = parser.parse_args(argv)
    if args.worker == "plan":
        print(json.dumps(worker_plan(args)))
        return 0
    if args.worker == "full":
        print(json.dumps(time_full_decode(str(args.model), args.codes, args.audio_out)))
        return 0

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.checkpoint import resolve_speech_tokenizer
    from vllm_omni.edge.testing.codes import random_codes
    from vllm_omni.edge.testing.make_checkpoint import ensure_checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    plans = {
        "windowed": args.windowed_plan or build_plan(model, args.out / "windowed", "windowed", args.build_args),
        "stateful": args.stateful_plan or build_plan(model, args.out / "stateful", "stateful", args.build_args),
    }
    weights_bytes = sum(
        path.stat().st_size for path in resolve_speech_tokenizer(str(model)).directory.glob("*.safetensors")
    )
    rows = []
    for seconds in args.seconds:
        frames = round(seconds * 12.5)
        codes_path = args.out / f"codes_{frames}.npy"
        np.save(codes_path, random_codes(frames, seed=2026)[0].T.numpy())
        print(f"[bench] full decode, {frames} frames", flush=True)
        full_audio = args.out / f"full_{frames}.npy"
        full = run_worker(
            __file__,
            ["--worker", "full", "--model", str(model), "--codes", str(codes_path), "--audio-out", str(full_audio)],
        )
        reference = np.load(full_audio)
        rows.append({"graph_kind": "full decode (eager torch)", "frames": frames, **full})
        for kind, plan in plans.items():
            print(f"[bench] {kind} plan, {frames} frames", flush=True)
            audio_out = args.out / f"{kind}_{frames}.npy"
            row = run_worker(
                __file__,
                ["--worker", "plan", "--plan", str(plan), "--codes", str(codes_path), "--audio-out", str(audio_out)],
            )
            row["snr_db_vs_full"] = round(snr_db(reference, np.load(audio_out)), 1)
            row["program_vs_weights"] = row["program_bytes"] / weights_bytes
            rows.append(row)
    result = {"geometry": args.geometry, "weights": "random", "weights_bytes": weights_bytes, "rows": rows}
    (args.out / "phone.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


def table(result: dict) -> str:
    lines = [
        f"npu_phone, {result['geometry']} geometry, RANDOM WEIGHTS; weights {result['weights_bytes'] / 1e6:.1f} MB",
        "",
        "| graph | plan | frames (audio s) | RTF | first audio s | open s | peak RSS MB | MB (x weights) | SNR dB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        program = (
            f"{row['program_bytes'] / 1e6:.1f} ({row['program_vs_weights']:.2f}x, {row['files']} file)"
            if "program_bytes" in row
            else "-"
        )
        first = row.get("first_audio_seconds")
        lines.append(
            f"| {row['graph_kind']} | {row.get('schedule', '-')} | {row['frames']} ({row['audio_seconds']:.2f}) | "
            f"{row['rtf']:.2f} | "
            f"{'-' if first is None else f'{first:.3f}'} | {row.get('open_seconds', 0):.1f} | "
            f"{row['peak_rss_mb']:.0f} | {program} | {row.get('snr_db_vs_full', '-')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
