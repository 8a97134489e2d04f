"""Codec-stream bandwidth and parse cost: bytes per second of speech, int16 vs 11-bit packing, vs PCM16.

    python -m benchmarks.bench_codec_stream --out out/bench [--seconds 30] [--frames-per-message 1 2 4 8 25]

The released stream geometry: 16 codebooks of 2048 codes, 12.5 frames/s, 24 kHz. For a
``--seconds`` stream of seeded random codes (codes are fixed-width on the wire, so their values do
not change the size) and each packing and message size, it encodes the whole stream (start
message, frame messages, done message) and counts bytes two ways: the messages alone (what a
message transport such as a WebSocket carries, its own framing aside) and the recording/HTTP
framing (5 bytes more per message, 4 for the magic). The baseline, measured in the same run, is
the PCM16 bytes of the same speech (48,000 B/s). It also times parsing the whole stream (the
client's cost per second of speech). Writes ``codec_stream.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import run_cli, table, write_json
from vllm_omni.edge.stream import (
    PACKINGS,
    CodecStreamEncoder,
    StreamStart,
    encode_recording,
    iter_events,
)

SAMPLE_RATE, HOP, QUANTIZERS, CODEBOOK = 24000, 1920, 16, 2048
PLAN_ID = "0" * 64  # a start message names the plan by its 64-hex id


def measure(frames: np.ndarray, packing: str, per_message: int, seconds: float) -> dict:
    start = StreamStart(
        num_quantizers=QUANTIZERS,
        codebook_size=CODEBOOK,
        frame_rate=SAMPLE_RATE / HOP,
        sample_rate=SAMPLE_RATE,
        packing=packing,
        max_frames_per_message=max(per_message, 25),
        hardware_class="cpu_x86_64",
        plan_id=PLAN_ID,
    )
    pieces = [frames[i : i + per_message] for i in range(0, len(frames), per_message)]
    encoder = CodecStreamEncoder(start)
    messages = [encoder.start(), *(encoder.frames(p, end_of_stream=i == len(pieces) - 1) for i, p in enumerate(pieces))]
    messages.append(encoder.done())
    message_bytes = sum(len(m) for m in messages)
    recording = encode_recording(start, [(p, {"end_of_stream": i == len(pieces) - 1}) for i, p in enumerate(pieces)])
    started = time.perf_counter()
    events = sum(1 for _ in iter_events(io.BytesIO(recording)))
    parse_seconds = time.perf_counter() - started
    assert events == len(messages)
    return {
        "packing": packing,
        "frames_per_message": per_message,
        "messages": len(messages),
        "message_bytes": message_bytes,
        "recording_bytes": len(recording),
        "bytes_per_second": round(message_bytes / seconds, 1),
        "recording_bytes_per_second": round(len(recording) / seconds, 1),
        "payload_bytes_per_second": round(start.payload_bytes(len(frames)) / seconds, 1),
        "vs_pcm16": round(message_bytes / (seconds * SAMPLE_RATE * 2), 5),
        "parse_ms_per_second_of_speech": round(1000 * parse_seconds / seconds, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--frames-per-message", type=int, nargs="+", default=[1, 2, 4, 8, 25])
    args = parser.parse_args(argv)
    frame_count = round(args.seconds * SAMPLE_RATE / HOP)
    seconds = frame_count * HOP / SAMPLE_RATE
    frames = np.random.default_rng(0).integers(0, CODEBOOK, size=(frame_count, QUANTIZERS))
    pcm16 = round(seconds * SAMPLE_RATE * 2)
    rows = [measure(frames, packing, size, seconds) for packing in PACKINGS for size in args.frames_per_message]
    result = {
        "stream": {"seconds": seconds, "frames": frame_count, "codebooks": QUANTIZERS, "codebook_size": CODEBOOK},
        "baseline_pcm16": {"bytes": pcm16, "bytes_per_second": pcm16 / seconds},
        "rows": rows,
    }
    path = write_json(args.out / "codec_stream.json", result)
    print(f"{seconds:.1f} s stream ({frame_count} frames); PCM16 baseline {pcm16 / seconds:,.0f} B/s")
    headers = ("packing", "frames/msg", "messages", "B/s (messages)", "B/s (framed)", "payload B/s", "vs PCM16")
    rows = (
        (
            row["packing"],
            row["frames_per_message"],
            row["messages"],
            f"{row['bytes_per_second']:.1f}",
            f"{row['recording_bytes_per_second']:.1f}",
            f"{row['payload_bytes_per_second']:.1f}",
            f"{row['vs_pcm16']:.4f} ({1 / row['vs_pcm16']:.0f}x smaller)",
            row["parse_ms_per_second_of_speech"],
        )
        for row in rows
    )
    print(table((*headers, "parse ms per s"), rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
