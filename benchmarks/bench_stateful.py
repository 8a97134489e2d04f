"""Stateful step on onnxruntime vs windowed decode vs full decode, one process per configuration.

    python benchmarks/bench_stateful.py --out out/bench [--geometry released] [--steps 2 4 16 25] [--seconds 20]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs).
Per configuration, in its own process (thread pools of different runtimes fight on 2 cores):

* ``stateful B``: onnxruntime step graph of B frames (exported, self-checked, reused if present),
  decoding a ``--seconds`` stream from a zero cache: real-time factor, first-audio latency (time
  of the first step, session creation excluded and reported apart), peak RSS, SNR vs full decode.
* ``windowed C``: eager torch decode of a full window (72 frames of context + C new frames), the
  steady state of windowed streaming; median of ``--window-repeats`` windows, RTF = time / (C * 80 ms).
* ``full``: eager torch full decode of the whole stream (the baseline of the ratios).

Writes ``stateful.json`` and prints a table; ratios are each RTF over the full decode's RTF.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers import peak_rss_mb, run_worker, time_full_decode

CONTEXT_FRAMES = 72


def worker_stateful(args) -> dict:
    import numpy as np

    from vllm_omni.edge.backends.onnxruntime import OnnxStepRunner
    from vllm_omni.edge.runtime import StatefulDecoder

    start = time.perf_counter()
    runner = OnnxStepRunner(args.graph)
    session_seconds = time.perf_counter() - start
    contract = runner.contract
    codes = np.load(args.codes)
    decoder = StatefulDecoder(runner)
    step_times, pieces = [], []
    for begin in range(0, len(codes), contract.step_frames):
        start = time.perf_counter()
        pieces.append(decoder.feed(codes[begin : begin + contract.step_frames]))
        step_times.append(time.perf_counter() - start)
    start = time.perf_counter()
    pieces.append(decoder.flush())
    step_times.append(time.perf_counter() - start)
    audio = np.concatenate(pieces)
    np.save(args.audio_out, audio)
    seconds = sum(step_times)
    audio_seconds = len(codes) * contract.samples_per_frame / contract.sample_rate
    return {
        "config": f"stateful B={contract.step_frames}",
        "seconds": seconds,
        "audio_seconds": audio_seconds,
        "rtf": seconds / audio_seconds,
        "first_audio_seconds": step_times[0],
        "warm_step_seconds": statistics.median(step_times[1:-1] or step_times),
        "session_seconds": session_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }


def worker_torch(args) -> dict:
    if args.worker == "full":
        full = time_full_decode(args.model, args.codes, args.audio_out)
        return {"config": "full decode", **full, "first_audio_seconds": full["seconds"]}
    import numpy as np
    import torch

    from vllm_omni.edge.checkpoint import load_code2wav_decoder
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE

    decoder = load_code2wav_decoder(args.model)
    codes = torch.from_numpy(np.load(args.codes)).T[None]
    hop_seconds = decoder.total_upsample / OUTPUT_SAMPLE_RATE
    with torch.inference_mode():
        window = codes[..., : CONTEXT_FRAMES + args.chunk]
        decoder.decode_unchecked(window)  # warm-up
        times = []
        for _ in range(args.window_repeats):
            start = time.perf_counter()
            decoder.decode_unchecked(window)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        return {
            "config": f"windowed C={args.chunk}",
            "seconds_per_window": seconds,
            "rtf": seconds / (args.chunk * hop_seconds),
            "compute_overhead": (CONTEXT_FRAMES + args.chunk) / args.chunk,
            "first_audio_seconds": None,
            "peak_rss_mb": peak_rss_mb(),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--steps", type=int, nargs="+", default=[2, 4, 16, 25])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--window-repeats", type=int, default=3)
    # worker mode (internal)
    parser.add_argument("--worker", choices=("stateful", "windowed", "full"))
    parser.add_argument("--graph"), parser.add_argument("--codes"), parser.add_argument("--audio-out")
    parser.add_argument("--model"), parser.add_argument("--chunk", type=int)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker_stateful(args) if args.worker == "stateful" else worker_torch(args)
        print(json.dumps(result))
        return 0

    import logging

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.backends.onnx import export_step_onnx
    from vllm_omni.edge.checkpoint import load_code2wav_decoder
    from vllm_omni.edge.testing.codes import random_codes
    from vllm_omni.edge.testing.make_checkpoint import ensure_checkpoint
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE

    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    decoder = load_code2wav_decoder(model)
    frames = round(args.seconds * OUTPUT_SAMPLE_RATE / decoder.total_upsample)
    codes_path = args.out / "stream_codes.npy"
    np.save(codes_path, random_codes(frames, seed=2024)[0].T.numpy())
    graphs = {}
    for size in args.steps:
        graph = args.out / "steps" / f"step_b{size}.onnx"
        if not graph.exists():
            print(f"[bench] exporting + checking the B={size} step graph", flush=True)
            start = time.perf_counter()
            export_step_onnx(decoder, size, graph)
            print(f"[bench]   {time.perf_counter() - start:.1f} s", flush=True)
        graphs[size] = graph
    del decoder

    print("[bench] full decode", flush=True)
    full = run_worker(
        __file__,
        [
            "--worker",
            "full",
            "--model",
            str(model),
            "--codes",
            str(codes_path),
            "--audio-out",
            str(args.out / "full.npy"),
        ],
    )
    reference = np.load(args.out / "full.npy")
    rows = [full]
    for size in args.steps:
        print(f"[bench] stateful B={size}", flush=True)
        row = run_worker(
            __file__,
            [
                "--worker",
                "stateful",
                "--graph",
                str(graphs[size]),
                "--codes",
                str(codes_path),
                "--audio-out",
                str(args.out / f"stateful_b{size}.npy"),
            ],
        )
        row["snr_db_vs_full"] = snr_db(reference, np.load(args.out / f"stateful_b{size}.npy"))
        rows.append(row)
        print(f"[bench] windowed C={size}", flush=True)
        rows.append(
            run_worker(
                __file__,
                [
                    "--worker",
                    "windowed",
                    "--model",
                    str(model),
                    "--codes",
                    str(codes_path),
                    "--chunk",
                    str(size),
                    "--window-repeats",
                    str(args.window_repeats),
                ],
            )
        )
    for row in rows:
        row["rtf_vs_full"] = row["rtf"] / full["rtf"]
    stream_seconds = full["audio_seconds"]
    report = {
        "benchmark": "stateful onnxruntime vs windowed vs full",
        "weights": "random",
        "geometry": args.geometry,
        "stream_frames": frames,
        "stream_seconds": stream_seconds,
        "baseline": "full decode RTF",
        "rows": rows,
    }
    (args.out / "stateful.json").write_text(json.dumps(report, indent=2))
    print(f"\n{args.geometry} geometry, RANDOM WEIGHTS, {frames} frames ({stream_seconds:.1f} s); one process per row")
    print(f"{'config':>16} {'RTF':>7} {'x full':>7} {'first audio s':>14} {'peak RSS MB':>12} {'SNR dB':>7}")
    for row in rows:
        first = "-" if row.get("first_audio_seconds") is None else f"{row['first_audio_seconds']:.3f}"
        snr = f"{row['snr_db_vs_full']:.1f}" if "snr_db_vs_full" in row else "-"
        print(
            f"{row['config']:>16} {row['rtf']:>7.3f} {row['rtf_vs_full']:>7.2f} {first:>14} "
            f"{row['peak_rss_mb']:>12.0f} {snr:>7}"
        )
    print(f"-> {args.out / 'stateful.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
