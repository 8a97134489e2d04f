"""Time the eager full decode (``decode_unchecked``) of the in-tree Code2Wav decoder.

    python benchmarks/bench_full_decode.py --out out/bench [--geometry released] [--frames 25 100 250]

RANDOM WEIGHTS: the checkpoint is written by ``vllm_omni.testing.make_checkpoint`` (reused
across runs). Reports, per input length: median seconds over ``--repeats`` warm runs, the
real-time factor (decode seconds / audio seconds; < 1 is faster than real time), the
multiply-accumulates counted from the module shapes, the achieved GFLOP/s, and each length's time
per frame as a ratio against the shortest length measured in the same run (the baseline).
Writes ``full_decode.json`` and prints a table. One process, one runtime (eager torch).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers import count_macs

from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.make_checkpoint import ensure_checkpoint


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
    (args.out / "full_decode.json").write_text(json.dumps(report, indent=2))
    print(f"\nfull decode, {args.geometry} geometry, RANDOM WEIGHTS, {args.threads} threads, torch {torch.__version__}")
    print(
        f"{'frames':>7} {'audio s':>8} {'decode s':>9} {'RTF':>6} {'GMAC/frame':>11} {'GFLOP/s':>8} {'per-frame x':>12}"
    )
    for row in rows:
        print(
            f"{row['frames']:>7} {row['audio_seconds']:>8.2f} {row['median_seconds']:>9.2f} "
            f"{row['real_time_factor']:>6.3f} {row['gmac_per_frame']:>11.2f} {row['gflops']:>8.1f} "
            f"{row['per_frame_vs_baseline']:>12.2f}"
        )
    print(f"-> {args.out / 'full_decode.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
