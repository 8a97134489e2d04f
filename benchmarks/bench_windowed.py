"""Windowed programs (npu_phone): export + lowering cost, ExecuTorch vs eager per chunk, SNR per ramp phase.

    python -m benchmarks.bench_windowed --out out/bench [--geometry released] [--seconds 30]
        [--ramp 2 4 8 16 25] [--context 72]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs).

1. Exports the ramp's programs with ``python -m vllm_omni.edge.decoder_export --backend executorch``
   (XNNPACK, every program checked in the ExecuTorch runtime; resumable, so a re-run reuses them).
2. Streams ``--seconds`` of seeded codes through the programs, one process per runtime (their
   thread pools fight on 2 cores): ``executorch`` (the ``.pte`` files in the ExecuTorch runtime)
   and ``eager`` (the same windows in eager torch), and a ``full`` decode in a third process.
3. Per program: export + lowering seconds, ``.pte`` size, median seconds per chunk in each
   runtime and their ratio, the windowing overhead ``(context + chunk) / chunk``, the real-time
   factor, and the SNR against the full decode of the chunks that program decoded.

Writes ``windowed.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import (
    BenchmarkError,
    ensure_checkpoint,
    full_decode,
    number,
    print_result,
    run_cli,
    run_worker,
    table,
    write_json,
)


def worker(args) -> dict:
    """Stream the codes one chunk at a time in one runtime; save the audio, return per-chunk seconds."""
    import numpy as np

    codes = np.load(args.codes)
    if args.worker == "executorch":
        from vllm_omni.edge.runtime.manifest_decoder import open_windowed_decoder

        start = time.perf_counter()
        decoder = open_windowed_decoder(args.programs)
        load_seconds = time.perf_counter() - start
    else:
        from vllm_omni.edge.checkpoint import load_code2wav_decoder
        from vllm_omni.edge.plan.manifest import WindowedManifest
        from vllm_omni.testing.reference import eager_windowed_decoder

        manifest = WindowedManifest.read(args.programs)
        start = time.perf_counter()
        decoder = eager_windowed_decoder(load_code2wav_decoder(args.model), manifest.ramp, manifest.context_frames)
        load_seconds = time.perf_counter() - start
    chunks, pieces, begin = [], [], 0
    while begin < len(codes):
        window = decoder.next_window
        size = min(window.chunk_frames, len(codes) - begin)
        start = time.perf_counter()
        piece = decoder.feed(codes[begin : begin + size])
        if size < window.chunk_frames:  # the stream's last, short chunk
            piece = np.concatenate([piece, decoder.flush()])
        chunks.append({"program": window.name, "frames": size, "seconds": time.perf_counter() - start})
        pieces.append(piece)
        begin += size
    np.save(args.audio_out, np.concatenate(pieces))
    return {"load_seconds": load_seconds, "chunks": chunks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ramp", type=int, nargs="+", default=[2, 4, 8, 16, 25])
    parser.add_argument("--context", type=int, default=72)
    parser.add_argument("--reuse-programs", action="store_true", help="use an existing manifest as it is")
    # worker mode (internal)
    parser.add_argument("--worker", choices=("executorch", "eager"), help=argparse.SUPPRESS)
    parser.add_argument("--programs"), parser.add_argument("--codes"), parser.add_argument("--audio-out")
    parser.add_argument("--model")
    args = parser.parse_args(argv)
    if args.worker:
        return print_result(worker(args))

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.graphs.window_contract import windowing_overhead
    from vllm_omni.edge.plan.manifest import WindowedManifest
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE
    from vllm_omni.testing.codes import random_codes

    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    programs = args.out / f"windowed-{args.geometry}"
    ramp = [str(size) for size in args.ramp]
    export = [sys.executable, "-m", "vllm_omni.edge.decoder_export", "--model", str(model), "--ramp", *ramp]
    export += ["--context", str(args.context), "--backend", "executorch", "--out-dir", str(programs)]
    if args.reuse_programs and (programs / "manifest.json").is_file():
        print(f"[bench] reusing the programs in {programs}", flush=True)
    else:
        print(f"[bench] {' '.join(export[1:])}", flush=True)
        if subprocess.run(export).returncode != 0:
            raise BenchmarkError(f"the export failed: {' '.join(export[1:])}")
    manifest = WindowedManifest.read(programs)
    hop = manifest.codec.samples_per_frame
    frames = round(args.seconds * OUTPUT_SAMPLE_RATE / hop)
    codes_path = args.out / "windowed_codes.npy"
    np.save(
        codes_path,
        random_codes(frames, manifest.codec.num_quantizers, manifest.codec.codebook_size, seed=2025)[0].T.numpy(),
    )

    results = {}
    for name in ("full", "eager", "executorch"):
        print(f"[bench] {name}", flush=True)
        audio_out = args.out / f"windowed_{name}.npy"
        if name == "full":
            results[name] = full_decode(model, codes_path, audio_out)
        else:
            options = {"model": model, "programs": programs, "codes": codes_path, "audio_out": audio_out}
            results[name] = run_worker(__spec__.name, name, **options)
        results[name]["audio"] = np.load(audio_out)
    reference = results["full"]["audio"]

    rows = []
    for entry in manifest.programs:
        row = {
            "program": entry.name,
            "context_frames": entry.context_frames,
            "chunk_frames": entry.chunk_frames,
            "overhead": windowing_overhead(entry.window),
            "export_seconds": entry.export_seconds,
            "pte_mb": entry.size_bytes / 1e6,
            "delegated_ops": entry.ops["delegated"],
            "portable_ops": entry.ops["portable"],
        }
        for name in ("executorch", "eager"):
            spans, begin = [], 0
            for chunk in results[name]["chunks"]:
                if chunk["program"] == entry.name:
                    spans.append((begin, chunk["frames"], chunk["seconds"]))
                begin += chunk["frames"]
            whole = [seconds for _, size, seconds in spans if size == entry.chunk_frames] or [s for *_, s in spans]
            row[f"{name}_chunks"] = len(spans)
            row[f"{name}_seconds_per_chunk"] = statistics.median(whole) if whole else None
            if spans:
                picks = np.concatenate([np.arange(b * hop, (b + n) * hop) for b, n, _ in spans])
                row[f"{name}_snr_db_vs_full"] = snr_db(reference[picks], results[name]["audio"][picks])
        if row["executorch_seconds_per_chunk"]:
            row["executorch_rtf"] = row["executorch_seconds_per_chunk"] / (entry.chunk_frames * hop / 24000)
            row["executorch_vs_eager"] = row["executorch_seconds_per_chunk"] / row["eager_seconds_per_chunk"]
        rows.append(row)
    full = results["full"]
    report = {
        "benchmark": "windowed programs: ExecuTorch (XNNPACK) vs eager torch, SNR vs full decode",
        "weights": "random",
        "geometry": args.geometry,
        "ramp": args.ramp,
        "context_frames": args.context,
        "stream_frames": frames,
        "stream_seconds": frames * hop / OUTPUT_SAMPLE_RATE,
        "baseline": "eager torch running the same window, in its own process",
        "full_decode": {"seconds": full["seconds"], "rtf": full["seconds"] / full["audio_seconds"]},
        "stream_snr_db_vs_full": {n: snr_db(reference, results[n]["audio"]) for n in ("executorch", "eager")},
        "program_load_seconds": results["executorch"]["load_seconds"],
        "rows": rows,
    }
    path = write_json(args.out / "windowed.json", report)
    print(f"\n{args.geometry} geometry, RANDOM WEIGHTS, {frames} frames; one process per runtime")
    headers = ("program", "window", "overhead", "export+lower s", ".pte MB", "ET s/chunk", "eager s/chunk")
    headers += ("ET/eager", "ET RTF", "chunks", "SNR dB vs full")
    print(
        table(
            headers,
            (
                (
                    row["program"], f"{row['context_frames']}+{row['chunk_frames']}", f"{row['overhead']:.2f}x",
                    number(row["export_seconds"], 0), number(row["pte_mb"], 0),
                    number(row["executorch_seconds_per_chunk"], 3), number(row["eager_seconds_per_chunk"], 3),
                    number(row.get("executorch_vs_eager")), number(row.get("executorch_rtf")),
                    row["executorch_chunks"], number(row.get("executorch_snr_db_vs_full"), 1),
                )
                for row in rows
            ),
        )
    )  # fmt: skip
    print(f"full decode RTF {report['full_decode']['rtf']:.2f}; whole-stream SNR {report['stream_snr_db_vs_full']}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
