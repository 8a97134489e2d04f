"""npu_phone against the CPU plan: the ExecuTorch (XNNPACK) stateful step next to the onnxruntime step.

    python -m benchmarks.bench_phone --out out/bench_phone --geometry released [--threads 1 2] [--seconds 20]
        [--model DIR] [--stateful-plan DIR] [--cpu-plan DIR] [--windowed-plan DIR | --windowed]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs), so
the SNRs measure the graphs, not the voice. The plans are the real builds of the same checkpoint
(``build --hardware npu_phone --graph stateful`` and ``build --hardware cpu_x86_64``, each verified
during its build); pass their directories, or let this script build them under ``--out``.

Each row runs in its own process (thread pools of different runtimes fight on 2 cores): the plan
opened with ``threads`` (onnxruntime's intra-op threads, ExecuTorch's thread pool), then the stream
fed one frame at a time, as a talker emits them. Per row: real-time factor (decode seconds / audio
seconds) and its ratio to the onnxruntime row at the same thread count (the baseline, measured in
the same run), first audio (decode seconds until the first PCM, the open excluded), the RSS before
the plan opened (Python, torch and the runtime's bindings) and the peak, the decoder's share of it
(peak minus before) against the weights' bytes, the delegated share of FLOPs and the time outside
the delegate (the build's delegation report), and the SNR of the whole stream against the eager
full decode (its own process).

Writes ``phone.json`` and ``phone.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.harness import (
    BenchmarkError,
    ensure_checkpoint,
    full_decode,
    number,
    peak_rss_mb,
    plot,
    print_result,
    rss_mb,
    run_cli,
    run_worker,
    table,
    write_json,
)


def drop_memory_locking() -> bool:
    """Run as an app does: without ``CAP_IPC_LOCK`` (as root the runtime's loader mlocks every mapped segment,
    so the whole program would count as resident). True when this process holds no such capability now."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    cap_ipc_lock = 14
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (low words), then the high words
    if libc.capget(header, data) != 0:
        return False
    data[0] &= ~(1 << cap_ipc_lock)
    data[1] &= ~(1 << cap_ipc_lock)
    data[2] &= ~(1 << cap_ipc_lock)
    if libc.capset(header, data) != 0:
        return False
    return libc.capget(header, data) == 0 and not data[0] & (1 << cap_ipc_lock)


def worker_plan(args) -> dict:
    import numpy as np

    no_memory_locking = drop_memory_locking()
    from vllm_omni.edge.plan import ExecPlan
    from vllm_omni.edge.runtime.open import open_decoder

    codes = np.load(args.codes)
    plan = ExecPlan.load(args.plan)
    if plan.backend == "executorch":
        import torch  # noqa: F401  (torch + the bindings: a Python cost, not the device's)
        from executorch.extension.pybindings import _C  # noqa: F401
    else:
        import onnxruntime  # noqa: F401
    before_open = rss_mb()
    start = time.perf_counter()
    threads = args.threads[0]
    decoder = open_decoder(plan, threads=threads)
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
    np.save(args.audio_out, np.concatenate(pieces))
    audio_seconds = len(codes) * plan.codec.samples_per_frame / plan.codec.sample_rate
    files = {artifact.file: artifact.size_bytes for artifact in plan.artifacts.values()}
    return {
        "plan": str(args.plan),
        "runtime": plan.backend,
        "graph_kind": plan.graph_kind,
        "hardware_class": plan.hardware_class,
        "threads": threads,
        "schedule": (
            f"ramp {plan.windowed['ramp']}, context {plan.windowed['context_frames']}"
            if plan.windowed
            else ", ".join(f"{role} B={plan.step_contract(role).step_frames}" for role in plan.artifacts)
        ),
        "frames": len(codes),
        "audio_seconds": audio_seconds,
        "open_seconds": open_seconds,
        "seconds": seconds,
        "rtf": seconds / audio_seconds,
        "first_audio_seconds": first_audio,
        "rss_before_open_mb": before_open,
        "peak_rss_mb": peak_rss_mb(),
        "program_bytes": sum(files.values()),
        "delegation": plan.build.get("delegation"),
        "cap_ipc_lock_dropped": no_memory_locking,
    }


def decoder_weight_bytes(directory: Path) -> int:
    """Bytes of the decoder's tensors (``decoder.*``) in the speech tokenizer's safetensors (not the encoder's)."""
    total = 0
    for path in directory.glob("*.safetensors"):
        with open(path, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        total += sum(
            row["data_offsets"][1] - row["data_offsets"][0]
            for name, row in header.items()
            if name.startswith("decoder.") and isinstance(row, dict)
        )
    return total


def build_plan(model: Path, out: Path, hardware: str, extra: list[str]) -> Path:
    from vllm_omni.edge.cli.main import main as edge_main

    if not (out / "exec_plan.json").exists():
        print(f"[bench] building {hardware} {' '.join(extra)} into {out}", flush=True)
        if edge_main(["build", "--hardware", hardware, *extra, "--model", str(model), "--out", str(out)]) != 0:
            raise BenchmarkError(f"the {hardware} build failed")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench_phone"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--model", type=Path, help="checkpoint (default: a random-weight one under --out)")
    parser.add_argument("--stateful-plan", type=Path, help="an npu_phone stateful plan (default: built under --out)")
    parser.add_argument("--cpu-plan", type=Path, help="a cpu_x86_64 plan (default: built under --out)")
    parser.add_argument("--windowed-plan", type=Path, help="also time an npu_phone windowed plan (at 2 threads)")
    parser.add_argument("--windowed", action="store_true", help="build and time the windowed plan (slow to lower)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=20.0, help="stream length")
    # worker mode (internal)
    parser.add_argument("--worker", choices=("plan",), help=argparse.SUPPRESS)
    parser.add_argument("--plan"), parser.add_argument("--codes"), parser.add_argument("--audio-out")
    args = parser.parse_args(argv)
    if args.worker == "plan":
        return print_result(worker_plan(args))

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.checkpoint import resolve_speech_tokenizer
    from vllm_omni.testing.codes import random_codes

    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    stateful = args.stateful_plan or build_plan(model, args.out / "stateful", "npu_phone", ["--graph", "stateful"])
    cpu = args.cpu_plan or build_plan(model, args.out / "cpu", "cpu_x86_64", [])
    windowed = args.windowed_plan
    if windowed is None and args.windowed:
        windowed = build_plan(model, args.out / "windowed", "npu_phone", [])
    weights_bytes = decoder_weight_bytes(resolve_speech_tokenizer(str(model)).directory)
    frames = round(args.seconds * 12.5)
    codes_path = args.out / f"codes_{frames}.npy"
    np.save(codes_path, random_codes(frames, seed=2026)[0].T.numpy())
    print(f"[bench] full decode, {frames} frames", flush=True)
    full_audio = args.out / f"full_{frames}.npy"
    full = full_decode(model, codes_path, full_audio)
    reference = np.load(full_audio)
    runs = [(plan, threads) for threads in args.threads for plan in (cpu, stateful)]
    runs += [(windowed, 2)] if windowed else []
    rows = []
    for plan, threads in runs:
        print(f"[bench] {plan.name}, {threads} thread(s), {frames} frames", flush=True)
        audio_out = args.out / f"{plan.name}_{threads}_{frames}.npy"
        row = run_worker(__spec__.name, "plan", plan=plan, codes=codes_path, audio_out=audio_out, threads=threads)
        row["snr_db_vs_full"] = round(snr_db(reference, np.load(audio_out)), 1)
        rows.append(row)
    baseline = {row["threads"]: row["rtf"] for row in rows if row["runtime"] == "onnxruntime"}
    for row in rows:
        row["rtf_vs_onnxruntime"] = row["rtf"] / baseline[row["threads"]] if row["threads"] in baseline else None
    result = {
        "geometry": args.geometry,
        "weights": "random",
        "weights_bytes": weights_bytes,
        "frames": frames,
        "host_cpus": os.cpu_count(),
        "full_decode": full,
        "rows": rows,
    }
    write_json(args.out / "phone.json", result)
    plot(args.out / "phone.png", lambda pyplot: draw(pyplot, result), dpi=80)
    print(report_table(result))
    return 0


def _label(row: dict) -> str:
    if row["runtime"] == "onnxruntime":
        return f"onnxruntime {row['hardware_class']}"
    return f"ExecuTorch {row['graph_kind']}"


def _delegation(row: dict) -> str:
    reports = row.get("delegation") or {}
    if not reports:
        return "-"
    main = max(reports.values(), key=lambda report: report["flops"])  # the main step
    share = main.get("outside_time_share")
    time_outside = f", {100 * share:.2f}% time outside" if share is not None else ""
    return f"{100 * main['delegated_flops_share']:.2f}% FLOPs{time_outside}"


def report_table(result: dict) -> str:
    weights_mib = result["weights_bytes"] / 2**20
    full = result["full_decode"]
    headers = ("runtime", "plan", "threads", "RTF", "x onnxruntime", "first audio s", "RSS before open MiB")
    headers += ("decoder RSS MiB (x weights)", "process peak MiB (x weights)", "delegated", "SNR dB")
    rows = []
    for row in result["rows"]:
        decoder = row["peak_rss_mb"] - row["rss_before_open_mb"]
        rows.append(
            (
                _label(row), row["schedule"], row["threads"], number(row["rtf"], 3),
                number(row.get("rtf_vs_onnxruntime")), number(row.get("first_audio_seconds"), 3),
                number(row["rss_before_open_mb"], 0), f"{decoder:.0f} ({decoder / weights_mib:.2f}x)",
                f"{row['peak_rss_mb']:.0f} ({row['peak_rss_mb'] / weights_mib:.2f}x)", _delegation(row),
                row["snr_db_vs_full"],
            )
        )  # fmt: skip
    title = (
        f"npu_phone vs cpu_x86_64, {result['geometry']} geometry, RANDOM WEIGHTS; {result['frames']} frames fed one "
        f"at a time; weights {weights_mib:.0f} MiB; eager full decode RTF {full['rtf']:.3f} (this host's load)"
    )
    return f"{title}\n\n{table(headers, rows, align='llrrrrrrrlr')}"


def draw(pyplot, result: dict):
    rows = result["rows"]
    labels = [f"{_label(row)}\n{row['threads']} thread(s)" for row in rows]
    figure, (speed, memory) = pyplot.subplots(1, 2, figsize=(11, 4))
    speed.barh(labels, [row["rtf"] for row in rows], color="tab:blue")
    speed.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    speed.set_xlabel("real-time factor (lower is faster)")
    weights_mib = result["weights_bytes"] / 2**20
    decoder_share = [(row["peak_rss_mb"] - row["rss_before_open_mb"]) / weights_mib for row in rows]
    memory.barh(labels, decoder_share, color="tab:green")
    memory.axvline(1.5, color="gray", linestyle="--", linewidth=1)
    memory.set_xlabel("decoder RSS / weights")
    memory.set_yticklabels([])
    figure.suptitle(
        f"npu_phone vs cpu_x86_64, {result['geometry']} geometry, RANDOM WEIGHTS, {result['frames']} frames"
    )
    return figure


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
