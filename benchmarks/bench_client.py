"""The edge client end to end: a 30 s codec stream through an execution plan, against the eager full decode.

    python -m benchmarks.bench_client --out out/bench [--geometry released] [--hardware cpu_x86_64] [--seconds 30]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs). The
plan is built (or kept) with ``python -m vllm_omni.edge build``'s builder and the class defaults,
the stream is recorded from seeded codes (packed11, ``--frames-per-message``), and each mode runs
in its own process:

* ``full``: eager torch full decode of the whole stream: the baseline of the ratios;
* ``client burst``: the client reads the recording as fast as it can (decode-bound);
* ``client paced``: the recording is released at the frame rate, as a talker producing speech in
  real time would send it: first-audio latency and underruns as a listener would meet them.

Writes ``client.json`` and prints a table (RTF = decode time / audio time; ratio = RTF / full decode RTF).
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

from benchmarks.harness import (
    ensure_checkpoint,
    full_decode,
    number,
    peak_rss_mb,
    print_result,
    run_cli,
    run_worker,
    table,
    write_json,
)


class PacedStream(io.RawIOBase):
    """A recording whose frame messages become readable at their frame time (a real-time server)."""

    def __init__(self, data: bytes, frame_rate: float):
        from vllm_omni.edge.stream import HEADER, KIND_BINARY, RECORDING_MAGIC, read_records, record

        self._pieces, self._times = [RECORDING_MAGIC], [0.0]
        frames = 0
        for kind, payload in read_records(io.BytesIO(data)):
            if kind == KIND_BINARY:
                count = HEADER.unpack_from(payload)[2]
                frames += count
            self._pieces.append(record(kind, payload))
            self._times.append(frames / frame_rate)  # a message leaves once its last frame exists
        self._start = None
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        if self._start is None:
            self._start = time.perf_counter()
        if not self._buffer:
            if not self._pieces:
                return 0
            delay = self._start + self._times.pop(0) - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self._buffer = self._pieces.pop(0)
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def worker_client(args) -> dict:
    import numpy as np

    from vllm_omni.edge.client import EdgeClient
    from vllm_omni.edge.plan import ExecPlan

    started = time.perf_counter()
    plan = ExecPlan.load(args.plan)
    client = EdgeClient(plan, jitter_ms=args.jitter_ms)
    load_seconds = time.perf_counter() - started
    data = Path(args.stream).read_bytes()
    stream = (
        PacedStream(data, plan.codec.sample_rate / plan.codec.samples_per_frame) if args.paced else io.BytesIO(data)
    )
    pieces: list = []
    report = client.run(stream, [pieces.append])
    np.save(args.audio_out, np.concatenate(pieces))
    return {
        "mode": "client paced" if args.paced else "client burst",
        "plan_load_seconds": round(load_seconds, 3),
        "seconds": report.decode_seconds,
        "audio_seconds": report.audio_seconds,
        "rtf": report.real_time_factor,
        "first_audio_ms": round(1000 * report.first_audio_seconds, 1),
        "underruns": report.underruns,
        "messages": report.messages,
        "stream_bytes": report.stream_bytes,
        "error": report.error,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--hardware", default="cpu_x86_64", help="a class whose runtime this machine has")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--frames-per-message", type=int, default=4)
    parser.add_argument("--jitter-ms", type=float, default=200.0)
    # worker mode (internal)
    parser.add_argument("--worker", choices=("client",), help=argparse.SUPPRESS)
    parser.add_argument("--plan"), parser.add_argument("--stream"), parser.add_argument("--paced", action="store_true")
    parser.add_argument("--audio-out")
    args = parser.parse_args(argv)
    if args.worker == "client":
        return print_result(worker_client(args))

    import numpy as np

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.builders.registry import build
    from vllm_omni.edge.builders.request import BuildRequest
    from vllm_omni.edge.hardware import get_hardware_class
    from vllm_omni.edge.stream import StreamStart, encode_recording
    from vllm_omni.testing.codes import random_codes

    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    started = time.perf_counter()
    plan_dir = args.out / "plans" / f"{args.hardware}-{args.geometry}"
    plan = build(
        get_hardware_class(args.hardware),
        BuildRequest(model=str(model), out_dir=plan_dir, progress=lambda m: print(f"[bench] {m}", flush=True)),
    )
    build_seconds = time.perf_counter() - started
    frames = round(args.seconds * plan.codec.sample_rate / plan.codec.samples_per_frame)
    codes = random_codes(frames, plan.codec.num_quantizers, plan.codec.codebook_size, seed=2024)[0].T.numpy().copy()
    codes_path = args.out / "client_codes.npy"
    np.save(codes_path, codes)
    start = StreamStart.for_plan(plan)
    size = args.frames_per_message
    batches = [(codes[i : i + size], {"end_of_stream": i + size >= frames}) for i in range(0, frames, size)]
    stream_path = args.out / "client_stream.qcs"
    stream_path.write_bytes(encode_recording(start, batches))

    print("[bench] full decode", flush=True)
    full = {"mode": "full decode (eager)", **full_decode(model, codes_path, args.out / "client_full.npy")}
    reference = np.load(args.out / "client_full.npy")
    rows = [full]
    for paced in (False, True):
        print(f"[bench] client {'paced' if paced else 'burst'}", flush=True)
        audio_out = args.out / "client_audio.npy"
        row = run_worker(
            __spec__.name, "client", plan=plan_dir, stream=stream_path, audio_out=audio_out,
            jitter_ms=args.jitter_ms, paced=paced,
        )  # fmt: skip
        row["snr_db_vs_full"] = round(snr_db(reference, np.load(args.out / "client_audio.npy")), 1)
        rows.append(row)
    for row in rows:
        row["rtf_vs_full"] = row["rtf"] / full["rtf"]
    result = {
        "random_weights": True,
        "geometry": args.geometry,
        "hardware_class": args.hardware,
        "plan_id": plan.plan_id,
        "plan_build_or_keep_seconds": round(build_seconds, 1),
        "frames": frames,
        "frames_per_message": size,
        "rows": rows,
    }
    path = write_json(args.out / "client.json", result)
    print(f"{args.hardware} plan {plan.plan_id[:12]} ({args.geometry}, RANDOM WEIGHTS), {frames} frames")
    headers = ("mode", "RTF", "RTF / full", "first audio ms", "underruns", "SNR vs full dB", "peak RSS MB")
    print(
        table(
            headers,
            (
                (
                    row["mode"], number(row["rtf"], 3), number(row["rtf_vs_full"]), row.get("first_audio_ms"),
                    row.get("underruns"), row.get("snr_db_vs_full"), number(row["peak_rss_mb"], 0),
                )
                for row in rows
            ),
        )
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
