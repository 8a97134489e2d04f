"""The exact CPU decode (stateful step on onnxruntime) against this machine's roofline, and its first audio.

    python -m benchmarks.bench_stateful --out out/bench [--geometry released|small] [--steps 1 2 4 8 16]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs). The
plan is the real ``cpu_x86_64`` build (one dynamic step graph, B = 1..16, first step 2), built or
kept in ``OUT/stateful/plan-GEOMETRY``. Every row runs in its own process with 2 threads (thread
pools of different runtimes fight on 2 cores):

* ``conv peak``: onnxruntime on every convolution shape of the decoder's step at B=16, in the
  1-D and the 2-D (height 1) form; the best GFLOP/s of any of them is this machine's conv peak in
  this run. Roofline RTF = (GFLOP per audio second, counted from the module shapes) / conv peak.
* ``step B``: the plan's graph at B frames per step over a ``--seconds`` stream from a zero cache:
  RTF (median step time / step audio), its ratio to the roofline, SNR vs the full decode.
* ``npu-form B=16``: the static NPU-form graph (what CPU plans shipped before), for comparison.
* ``full decode``: eager torch, the whole stream at once (baseline of the ``x full`` column).
* ``profile``, ``profile_first_step``: onnxruntime's profiler over the stream at B=16 and at the
  first step's B=2: time per op type (and per step).
* first audio, each scenario in a fresh process: ``open_decoder(plan)`` + the first B=2 step,
  split into imports, plan load (validation, sha256 or remembered identity), session, first step:
  ``first start on this device`` (empty device cache), ``cold start`` (a new process, device
  cache filled), ``no device cache`` (every file hashed, graph optimized at load).
* ``warm utterance``: with open sessions, ``reset()`` + the first B=2 step of a new utterance.
* memory and disk: peak RSS of a whole decode through the plan (both roles), against the same
  with two NPU-form graphs (B=2 and B=16, two sessions); the plan's bytes against the weights'.

Writes ``stateful.json``, ``stateful_rtf.png`` and ``stateful_first_audio.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    count_macs,
    ensure_checkpoint,
    full_decode,
    number,
    peak_rss_mb,
    plot,
    print_result,
    run_cli,
    run_worker,
    table,
    write_json,
)

THREADS = 2
FIRST_STEP = 2


# -- workers (each in its own process) ------------------------------------------------------------


def worker_conv_peak(args) -> dict:
    """GFLOP/s of every conv shape of a B=16 step in onnxruntime, 1-D and 2-D form; the best is the peak."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    shapes = json.loads(Path(args.shapes).read_text())
    rows = []
    for shape in shapes:
        cin, cout, kernel, dilation, groups, length = (shape[k] for k in ("cin", "cout", "k", "dil", "groups", "t"))
        for form in ("1d", "2d"):
            weight_shape = [cout, cin // groups, kernel] if form == "1d" else [cout, cin // groups, 1, kernel]
            input_shape = [1, cin, length] if form == "1d" else [1, cin, 1, length]
            weight = np.random.default_rng(0).standard_normal(weight_shape).astype(np.float32) * 0.05
            node = helper.make_node(
                "Conv", ["x", "w"], ["y"], group=groups, dilations=[dilation] if form == "1d" else [1, dilation]
            )
            graph = helper.make_graph(
                [node],
                "conv",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                [numpy_helper.from_array(weight, "w")],
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
            options = ort.SessionOptions()
            options.intra_op_num_threads = THREADS
            options.log_severity_level = 3
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            x = np.random.default_rng(1).standard_normal(input_shape).astype(np.float32)
            session.run(None, {"x": x})
            best = min(_timed(session.run, None, {"x": x}) for _ in range(args.repeats))
            flop = 2 * cout * (cin // groups) * kernel * (length - dilation * (kernel - 1))
            rows.append({**shape, "form": form, "seconds": best, "gflops": flop / best / 1e9})
    return {"config": "conv peak", "rows": rows, "peak_gflops": max(r["gflops"] for r in rows)}


def _timed(call, *args) -> float:
    start = time.perf_counter()
    call(*args)
    return time.perf_counter() - start


def worker_step(args) -> dict:
    """Decode the stream at B frames per step through one graph (the plan's, or a static NPU-form one)."""
    import numpy as np

    from vllm_omni.edge.backends.onnx.run import OnnxStepGraph
    from vllm_omni.edge.backends.onnx.session_cache import OptimizedModelCache
    from vllm_omni.edge.files import file_sha256
    from vllm_omni.edge.runtime import StatefulDecoder

    path = Path(args.graph)
    cache = OptimizedModelCache.default() if args.cached else None
    start = time.perf_counter()
    graph = OnnxStepGraph(path, THREADS, cache, file_sha256(path) if cache else None)
    session_seconds = time.perf_counter() - start
    runner = graph.runner(args.step_frames if graph.contract.dynamic else None)
    step = runner.contract.step_frames
    codes = np.load(args.codes)
    decoder = StatefulDecoder(runner)
    times, pieces = [], []
    whole = len(codes) - len(codes) % step
    for begin in range(0, whole, step):
        start = time.perf_counter()
        pieces.append(decoder.feed(codes[begin : begin + step]))
        times.append(time.perf_counter() - start)
    pieces += [decoder.feed(codes[whole:]), decoder.flush()]  # the last, partial step (not timed)
    np.save(args.audio_out, np.concatenate(pieces))
    step_seconds = statistics.median(times[1:] or times)
    return {
        "config": args.label,
        "step_frames": step,
        "session_seconds": session_seconds,
        "first_step_seconds": times[0],
        "step_seconds": step_seconds,
        "rtf": step_seconds / (step * runner.contract.samples_per_frame / runner.contract.sample_rate),
        "peak_rss_mb": peak_rss_mb(),
    }


def worker_profile(args) -> dict:
    """onnxruntime's profiler over the stream at ``step_frames``: milliseconds per op type, and per step."""
    import numpy as np
    import onnxruntime as ort

    from vllm_omni.edge.backends.onnx.session_cache import CPU, session_options
    from vllm_omni.edge.graphs.step_contract import StepContract
    from vllm_omni.edge.runtime import StatefulDecoder

    options = session_options(THREADS)
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(args.audio_out).with_suffix(""))
    session = ort.InferenceSession(args.graph, options, providers=CPU)
    contract = StepContract.from_metadata(session.get_modelmeta().custom_metadata_map)
    contract = contract.for_frames(args.step_frames)

    class Runner:
        def run(self, codes, freqs, valid, cache):
            feeds = {"audio_codes": codes, "freqs_in": freqs, "cache_valid": valid, "cache_in": cache}
            return session.run(None, feeds)

    runner = Runner()
    runner.contract = contract
    codes = np.load(args.codes)
    decoder = StatefulDecoder(runner)
    decoder.feed(codes[: contract.step_frames])
    decoder.feed(codes[contract.step_frames :])
    events = json.loads(Path(session.end_profiling()).read_text())
    per_op: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            per_op[op] = per_op.get(op, 0.0) + event["dur"] / 1e3
    total = sum(per_op.values())
    rows = sorted(({"op": op, "ms": ms, "share": ms / total} for op, ms in per_op.items()), key=lambda r: -r["ms"])
    steps = -(-len(codes) // contract.step_frames)
    return {
        "config": f"profile B={contract.step_frames}",
        "step_frames": contract.step_frames,
        "steps": steps,
        "total_ms": total,
        "rows": rows,
    }


def worker_first_audio(args) -> dict:
    """A fresh process: open the plan, decode the first B=2 step; each part timed."""
    start = time.perf_counter()
    import numpy as np

    from vllm_omni.edge.backends.interface import RunnerOptions
    from vllm_omni.edge.backends.registry import get_backend
    from vllm_omni.edge.plan.model import ExecPlan
    from vllm_omni.edge.runtime import StatefulDecoder

    imported = time.perf_counter()
    import onnxruntime  # noqa: F401  (the runtime library itself: loaded once per process, at app start)

    runtime_imported = time.perf_counter()
    plan = ExecPlan.load(args.plan)
    loaded = time.perf_counter()
    backend = get_backend(plan.backend)
    options = RunnerOptions(threads=THREADS)
    runners = {role: backend.open_runner(plan, role, options) for role in plan.artifacts}
    decoder = StatefulDecoder(runners["main"], runners.get("first"))
    opened = time.perf_counter()
    codes = np.load(args.codes)
    audio = decoder.feed(codes[:FIRST_STEP])
    first = time.perf_counter()
    assert len(audio) == FIRST_STEP * plan.codec.samples_per_frame
    result = {
        "config": args.label,
        "imports_seconds": imported - start,
        "runtime_import_seconds": runtime_imported - imported,
        "plan_seconds": loaded - runtime_imported,
        "session_seconds": opened - loaded,
        "first_step_seconds": first - opened,
        "first_audio_seconds": first - runtime_imported,  # open_decoder + the first step
        "from_process_start_seconds": first - start,
        "cache_hit": bool(getattr(runners["main"], "graph", None) and runners["main"].graph.cached),
    }
    if args.utterances:  # warm sessions: the first step of each new utterance
        times = []
        for _ in range(args.utterances):
            decoder.reset()
            begin = time.perf_counter()
            decoder.feed(codes[:FIRST_STEP])
            times.append(time.perf_counter() - begin)
        result["warm_first_step_seconds"] = statistics.median(times)
        result["warm_first_step_min_seconds"] = min(times)
        pieces = [decoder.feed(codes[FIRST_STEP:])]  # the whole stream through both roles: peak memory
        pieces.append(decoder.flush())
        result["stream_peak_rss_mb"] = peak_rss_mb()
    return result


def worker_two_sessions(args) -> dict:
    """Peak RSS of decoding the stream with two NPU-form graphs (B=2 first, B=16 main): two weight copies."""
    import numpy as np

    from vllm_omni.edge.backends.onnx.run import OnnxStepRunner
    from vllm_omni.edge.runtime import StatefulDecoder

    main, first = OnnxStepRunner(args.graph, THREADS), OnnxStepRunner(args.first_graph, THREADS)
    decoder = StatefulDecoder(main, first)
    codes = np.load(args.codes)
    decoder.feed(codes)
    decoder.flush()
    return {"config": "two npu-form sessions", "stream_peak_rss_mb": peak_rss_mb()}


WORKERS = {
    "conv_peak": worker_conv_peak,
    "step": worker_step,
    "profile": worker_profile,
    "first_audio": worker_first_audio,
    "two_sessions": worker_two_sessions,
}


# -- the run --------------------------------------------------------------------------------------


def conv_shapes(decoder, step_frames: int) -> list[dict]:
    """Distinct (cin, cout, k, dilation, groups, input length) of the decoder's 1-D convolutions at one step."""
    import torch
    from torch import nn

    seen, shapes = set(), []

    def hook(module, inputs, output):
        key = (
            module.in_channels,
            module.out_channels,
            module.kernel_size[0],
            module.dilation[0],
            module.groups,
            inputs[0].shape[-1],
        )
        if key not in seen:
            seen.add(key)
            shapes.append(dict(zip(("cin", "cout", "k", "dil", "groups", "t"), key, strict=True)))

    handles = [m.register_forward_hook(hook) for m in decoder.modules() if isinstance(m, nn.Conv1d)]
    codes = torch.zeros(1, decoder.config.num_quantizers, step_frames, dtype=torch.int64)
    with torch.inference_mode():
        decoder(codes)
    for handle in handles:
        handle.remove()
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--utterances", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    for name in ("graph", "first-graph", "codes", "audio-out", "plan", "label", "shapes"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--step-frames", type=int)
    parser.add_argument("--cached", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        return print_result(WORKERS[args.worker](args))
    return run(args)


def run(args) -> int:
    import logging

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.builders.registry import build
    from vllm_omni.edge.builders.request import BuildRequest
    from vllm_omni.edge.checkpoint import load_code2wav_decoder, resolve_speech_tokenizer
    from vllm_omni.edge.hardware.registry import get_hardware_class
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE
    from vllm_omni.testing.codes import random_codes

    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    main_step = max(args.steps)
    work = args.out / "stateful"
    work.mkdir(parents=True, exist_ok=True)
    # This run's device cache (remembered files, optimized graphs), inherited by every worker.
    os.environ.setdefault("VLLM_OMNI_EDGE_CACHE_DIR", str((work / "device-cache").resolve()))
    model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    plan_dir = work / f"plan-{args.geometry}"
    print(f"[bench] cpu_x86_64 plan (first B={FIRST_STEP}, main B={main_step}) in {plan_dir}", flush=True)
    plan = build(
        get_hardware_class("cpu_x86_64"),
        BuildRequest(
            model=str(model),
            out_dir=plan_dir,
            step_frames=main_step,
            first_step_frames=FIRST_STEP,
            force=True,
            progress=lambda line: print(f"[build] {line}", flush=True),
        ),
    )
    graph = plan.path("main")
    decoder = load_code2wav_decoder(model)
    frames = round(args.seconds * OUTPUT_SAMPLE_RATE / decoder.total_upsample)
    codes_path = work / "stream_codes.npy"
    np.save(codes_path, random_codes(frames, seed=2024)[0].T.numpy())
    npu = {size: work / f"npu_{args.geometry}_b{size}.onnx" for size in (FIRST_STEP, main_step)}
    for size, path in npu.items():
        if not path.exists():
            print(f"[bench] exporting the NPU-form B={size} graph (the form CPU plans shipped before)", flush=True)
            export_step_onnx(decoder, size, path)
    shapes_path = work / "conv_shapes.json"
    shapes_path.write_text(json.dumps(conv_shapes(decoder, main_step)))
    macs_per_frame = count_macs(decoder, random_codes(32, seed=1)) / 32
    gflop_per_audio_second = 2 * macs_per_frame * OUTPUT_SAMPLE_RATE / decoder.total_upsample / 1e9
    weights_bytes = resolve_speech_tokenizer(str(model)).weights_path.stat().st_size
    del decoder

    def worker(name: str, **options) -> dict:
        return run_worker(__spec__.name, name, **options)

    print("[bench] conv peak", flush=True)
    peak = worker("conv_peak", shapes=shapes_path, repeats=args.repeats)
    roofline_rtf = gflop_per_audio_second / peak["peak_gflops"]
    print("[bench] full decode", flush=True)
    full = {"config": "full decode (eager)", **full_decode(model, codes_path, work / "full.npy")}
    reference = np.load(work / "full.npy")
    steps = []
    runs = [(f"step B={size}", graph, size, True) for size in args.steps]
    runs.append((f"npu-form B={main_step}", npu[main_step], main_step, False))
    for label, path, size, cached in runs:
        print(f"[bench] {label}", flush=True)
        audio_out = work / f"audio_{len(steps)}.npy"
        row = worker(
            "step", graph=path, step_frames=size, codes=codes_path, audio_out=audio_out, label=label, cached=cached
        )
        row["snr_db_vs_full"] = snr_db(reference, np.load(audio_out))
        row["x_roofline"] = row["rtf"] / roofline_rtf
        row["x_full"] = row["rtf"] / full["rtf"]
        steps.append(row)
    print("[bench] profile", flush=True)
    profile = worker("profile", graph=graph, step_frames=main_step, codes=codes_path, audio_out=work / "profile")
    profile_first = worker(
        "profile", graph=graph, step_frames=FIRST_STEP, codes=codes_path, audio_out=work / "profile_first"
    )

    print("[bench] first audio", flush=True)
    with tempfile.TemporaryDirectory(dir=work) as fresh:
        scenarios = []
        for label, env in (
            ("first start on this device", {"VLLM_OMNI_EDGE_CACHE_DIR": fresh}),
            ("cold start", {"VLLM_OMNI_EDGE_CACHE_DIR": fresh}),
            ("no device cache", {"VLLM_OMNI_EDGE_ORT_CACHE": "0", "VLLM_OMNI_EDGE_REMEMBER_VERIFIED": "0"}),
        ):
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            try:
                utterances = args.utterances if label == "cold start" else 0
                scenarios.append(
                    worker("first_audio", plan=plan_dir, codes=codes_path, label=label, utterances=utterances)
                )
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
    two = worker("two_sessions", graph=npu[main_step], first_graph=npu[FIRST_STEP], codes=codes_path)
    cold = scenarios[1]
    plan_bytes = sum({a.file: a.size_bytes for a in plan.artifacts.values()}.values())
    report = {
        "benchmark": "stateful step on onnxruntime vs the roofline; first audio",
        "weights": "random",
        "geometry": args.geometry,
        "threads": THREADS,
        "stream_frames": frames,
        "stream_seconds": full["audio_seconds"],
        "gflop_per_audio_second": gflop_per_audio_second,
        "conv_peak_gflops": peak["peak_gflops"],
        "roofline_rtf": roofline_rtf,
        "baseline": "roofline RTF (same run); full decode RTF for x_full",
        "full_decode": full,
        "steps": steps,
        "conv_peak": peak,
        "profile": profile,
        "profile_first_step": profile_first,
        "first_audio": scenarios,
        "memory": {
            "plan_stream_peak_rss_mb": cold.get("stream_peak_rss_mb"),
            "two_npu_sessions_peak_rss_mb": two["stream_peak_rss_mb"],
        },
        "disk": {
            "plan_bytes": plan_bytes,
            "weights_bytes": weights_bytes,
            "plan_files": sorted({a.file for a in plan.artifacts.values()}),
        },
    }
    write_json(args.out / "stateful.json", report)
    plots = write_plots(report, args.out)
    print_table(report)
    print(f"-> {args.out / 'stateful.json'}" + "".join(f", {p}" for p in plots))
    for leftover in work.glob("profile*.json"):
        leftover.unlink()
    shutil.rmtree(work / "tmp", ignore_errors=True)
    return 0


def print_table(report: dict) -> None:
    print(
        f"\n{report['geometry']} geometry, RANDOM WEIGHTS, {report['stream_frames']} frames "
        f"({report['stream_seconds']:.1f} s), {report['threads']} threads, one process per row"
    )
    print(
        f"roofline: {report['gflop_per_audio_second']:.1f} GFLOP per audio second / conv peak "
        f"{report['conv_peak_gflops']:.0f} GFLOP/s = RTF {report['roofline_rtf']:.3f}"
    )
    full = report["full_decode"]
    rows = [(full["config"], number(full["rtf"], 3), number(full["rtf"] / report["roofline_rtf"]), "1.00")]
    rows[0] += ("-", "-", number(full["peak_rss_mb"], 0))
    for row in report["steps"]:
        rows.append(
            (
                row["config"], number(row["rtf"], 3), number(row["x_roofline"]), number(row["x_full"]),
                number(row["step_seconds"] * 1e3, 1), number(row["snr_db_vs_full"], 1), number(row["peak_rss_mb"], 0),
            )
        )  # fmt: skip
    print(table(("config", "RTF", "x roofline", "x full", "step ms", "SNR dB", "RSS MB"), rows))
    frame_seconds = report["stream_seconds"] / report["stream_frames"]
    for profile in (report["profile"], report["profile_first_step"]):
        frames, steps = profile["step_frames"], profile["steps"]
        roofline_ms = report["gflop_per_audio_second"] * frames * frame_seconds / report["conv_peak_gflops"] * 1e3
        print(
            f"\nwhere the B={frames} step's time goes (onnxruntime profiler, {profile['total_ms'] / steps:.1f} ms "
            f"of kernels per step; roofline {roofline_ms:.1f} ms):"
        )
        ops = [(row["op"], f"{row['share'] * 100:.1f}%", number(row["ms"] / steps)) for row in profile["rows"][:10]]
        print(table(("op", "share", "ms per step"), ops))
    print()
    headers = ("first audio (open + 1st step)", "s", "plan", "session", "1st step", "imports", "onnxruntime")
    rows = [
        (
            row["config"], number(row["first_audio_seconds"], 3), number(row["plan_seconds"], 3),
            number(row["session_seconds"], 3), number(row["first_step_seconds"], 3), number(row["imports_seconds"], 3),
            number(row["runtime_import_seconds"], 3), number(row["from_process_start_seconds"], 3),
        )
        for row in report["first_audio"]
    ]  # fmt: skip
    print(table((*headers, "from start"), rows))
    cold = report["first_audio"][1]
    if "warm_first_step_seconds" in cold:
        print(
            f"warm utterance (reset + first B=2 step, sessions open): median "
            f"{cold['warm_first_step_seconds'] * 1e3:.1f} ms, min {cold['warm_first_step_min_seconds'] * 1e3:.1f} ms"
        )
    memory, disk = report["memory"], report["disk"]
    print(
        f"peak RSS decoding the stream: plan (one graph, both roles) {memory['plan_stream_peak_rss_mb']:.0f} MB; "
        f"two NPU-form sessions {memory['two_npu_sessions_peak_rss_mb']:.0f} MB"
    )
    print(
        f"plan on disk {disk['plan_bytes'] / 1e6:.0f} MB ({', '.join(disk['plan_files'])}) for "
        f"{disk['weights_bytes'] / 1e6:.0f} MB of weights ({disk['plan_bytes'] / disk['weights_bytes']:.2f}x)"
    )


def write_plots(report: dict, out: Path) -> list[Path]:
    """RTF per step size against the roofline, and the first-audio breakdown (PNG; needs matplotlib)."""

    def rtf(pyplot):
        rows = report["steps"]
        figure, axes = pyplot.subplots(figsize=(7, 4))
        labels = [row["config"] for row in rows] + ["full decode"]
        values = [row["rtf"] for row in rows] + [report["full_decode"]["rtf"]]
        axes.bar(labels, values, color=["tab:blue"] * (len(rows) - 1) + ["tab:gray", "tab:gray"])
        axes.axhline(report["roofline_rtf"], color="tab:red", label=f"roofline {report['roofline_rtf']:.3f}")
        axes.axhline(1.2 * report["roofline_rtf"], color="tab:red", linestyle="--", label="1.2 x roofline")
        axes.set_ylabel("real-time factor (lower is faster)")
        axes.set_title(f"stateful step, onnxruntime, {report['geometry']} geometry, random weights")
        axes.tick_params(axis="x", labelrotation=30)
        axes.legend()
        return figure

    def first_audio(pyplot):
        figure, axes = pyplot.subplots(figsize=(7, 3.5))
        parts = ("plan_seconds", "session_seconds", "first_step_seconds")
        names = [row["config"] for row in report["first_audio"]]
        left = [0.0] * len(names)
        for part in parts:
            widths = [row[part] for row in report["first_audio"]]
            axes.barh(names, widths, left=left, label=part.removesuffix("_seconds").replace("_", " "))
            left = [a + b for a, b in zip(left, widths, strict=True)]
        axes.axvline(0.5, color="tab:red", linestyle="--", label="0.5 s goal")
        axes.set_xlabel("seconds from open_decoder(plan) to the first audio (imports apart)")
        axes.legend(fontsize=8)
        return figure

    drawn = [plot(out / "stateful_rtf.png", rtf), plot(out / "stateful_first_audio.png", first_audio)]
    return [path for path in drawn if path is not None]


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
