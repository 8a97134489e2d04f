"""Time the eager full decode (``decode_unchecked``) of the in-tree Code2Wav decoder.

    python -m benchmarks.bench_full_decode --out out/bench [--geometry released] [--frames 25 100 250]

RANDOM WEIGHTS: the checkpoint is written by ``vllm_omni.testing.make_checkpoint`` (reused
across runs). Reports, per input length: median seconds over ``--repeats`` warm runs, the
real-time factor (decode seconds / audio seconds; < 1 is faster than real time), the
multiply-accumulates counted from the module shapes, the achieved GFLOP/s, and each length's time
per frame as a ratio against the shortest length measured in the same run (the baseline).
Writes ``full_decode.json`` and prints a table. One process, one runtime (eager torch).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from benchmarks.harness import count_macs, ensure_checkpoint, number, run_cli, table, write_json
from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE
from vllm_omni.testing.codes import random_codes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--model", help="use this checkpoint instead of a random-weight one")
    parser.add_argument("--frames", type=int, nargs="+", default=[25, 100, 250])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    model = args.model or ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    decoder = load_code2wav_decoder(model)
    rows = []
    for frames in sorted(args.frames):
        codes = random_codes(frames, decoder.config.num_quantizers, decoder.config.codebook_size)
        macs = count_macs(decoder, codes)
        times = []
        with torch.inference_mode():
            decoder.decode_unchecked(codes)  # warm-up
            for _ in range(args.repeats):
                start = time.perf_counter()
                decoder.decode_unchecked(codes)
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        audio_seconds = frames * decoder.total_upsample / OUTPUT_SAMPLE_RATE
        rows.append(
            {
                "frames": frames,
                "audio_seconds": audio_seconds,
                "median_seconds": seconds,
                "all_seconds": times,
                "real_time_factor": seconds / audio_seconds,
                "gmac": macs / 1e9,
                "gmac_per_frame": macs / frames / 1e9,
                "gflops": 2 * macs / seconds / 1e9,
            }
        )
        print(f"[bench] {frames} frames: {seconds:.2f} s (RTF {seconds / audio_seconds:.3f})", flush=True)
    baseline = rows[0]["median_seconds"] / rows[0]["frames"]
    for row in rows:
        row["per_frame_vs_baseline"] = (row["median_seconds"] / row["frames"]) / baseline
    report = {
        "benchmark": "full_decode (eager torch, decode_unchecked)",
        "weights": "random" if not args.model else str(args.model),
        "geometry": args.geometry,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "baseline": f"time per frame at {rows[0]['frames']} frames",
        "rows": rows,
    }
    path = write_json(args.out / "full_decode.json", report)
    print(f"\nfull decode, {args.geometry} geometry, RANDOM WEIGHTS, {args.threads} threads, torch {torch.__version__}")
    headers = ("frames", "audio s", "decode s", "RTF", "GMAC/frame", "GFLOP/s", "per-frame x")
    print(
        table(
            headers,
            (
                (
                    row["frames"],
                    number(row["audio_seconds"]),
                    number(row["median_seconds"]),
                    number(row["real_time_factor"], 3),
                    number(row["gmac_per_frame"]),
                    number(row["gflops"], 1),
                    number(row["per_frame_vs_baseline"]),
                )
                for row in rows
            ),
        )
    )
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
