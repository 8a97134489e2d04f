"""Serving on loopback: codec frames to the device vs PCM decoded on the server, 1/4/8 concurrent streams.

    .venv-vllm/bin/python -m benchmarks.bench_serve --out out/bench [--frames 50] [--concurrency 1 4 8]

RANDOM WEIGHTS (a tiny-talker checkpoint at the small decoder geometry, written under ``--out``).
One ``vllm serve --omni --edge-hardware cpu_x86_64`` server on 127.0.0.1; for each concurrency, N
clients post the same greedy request at once, in two modes measured in the same run:

* ``codec``: the wire protocol for the cpu_x86_64 plan, decoded on the client side with the plan
  (``EdgeClient``-style: ``open_decoder`` + ``feed``) as the messages arrive;
* ``pcm``: ``response_format: pcm, stream: true``, the server decodes with the exact stateful step.

Per stream: time to the first frame (codec) and to the first audio, frames per second, bytes per
second of speech on the wire (12.5 frames = 1 s of speech; the small decoder geometry makes 48
samples per frame, so its PCM is 1,200 B/s where the released 1,920 samples make 48,000 B/s).
Writes ``serve.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.harness import ensure_checkpoint, number, run_cli, table, vllm_server, write_json

TALKER_FRAME_RATE = 12.5  # Qwen3-TTS 12 Hz: frames per second of speech
REQUEST = {"input": "Hello there, this is a test of the serving path.", "voice": "Ryan", "language": "English"}


class CountingReader(io.RawIOBase):
    """A response body that counts the bytes read through it."""

    def __init__(self, stream) -> None:
        self.stream, self.bytes = stream, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.bytes += len(data)
        return data


def one_stream(url: str, mode: str, frames: int, plan_dir: Path) -> dict:
    from vllm_omni.edge.plan.model import ExecPlan
    from vllm_omni.edge.runtime import open_decoder
    from vllm_omni.edge.stream import FrameBatch, iter_events

    body = {**REQUEST, "greedy": True, "max_frames": frames}
    body |= (
        {"response_format": "codec", "edge_hardware": "cpu_x86_64"}
        if mode == "codec"
        else {"response_format": "pcm", "stream_format": "audio"}
    )
    request = urllib.request.Request(
        url + "/v1/audio/speech", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    first_frame = first_audio = None
    wire = samples = count = 0
    with urllib.request.urlopen(request, timeout=600) as response:
        if mode == "pcm":
            while chunk := response.read1(4096):  # what has arrived, not a full 4 KiB
                first_audio = first_audio or time.perf_counter() - start
                wire += len(chunk)
                samples += len(chunk) // 2
        else:
            decoder = open_decoder(plan_dir, check_sha256=False)
            counted = CountingReader(response)
            for event in iter_events(counted):  # messages as they arrive
                if isinstance(event, FrameBatch) and len(event.frames):
                    first_frame = first_frame or time.perf_counter() - start
                    audio = decoder.feed(event.frames)
                    count += len(event.frames)
                    if audio.size:
                        first_audio = first_audio or time.perf_counter() - start
                    samples += audio.size
            samples += decoder.flush().size
            wire = counted.bytes
    seconds = time.perf_counter() - start
    codec = ExecPlan.load(plan_dir, check_sha256=False).codec
    frames_heard = count or samples / codec.samples_per_frame
    speech_seconds = frames_heard / TALKER_FRAME_RATE  # the talker's frames are 80 ms of speech at any geometry
    return {
        "mode": mode,
        "seconds": seconds,
        "first_frame_s": first_frame,
        "first_audio_s": first_audio,
        "frames": frames_heard,
        "speech_seconds": speech_seconds,
        "frames_per_s": frames_heard / seconds,
        "wire_bytes_per_speech_s": wire / speech_seconds if speech_seconds else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()

    work = args.out / "serve"
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint(work / "ckpt", "small", talker="tiny")
    plan_dir = work / "artifacts" / "cpu_x86_64"
    rows = []
    with vllm_server(checkpoint, work / "artifacts", work / "server.log") as server:
        one_stream(server.url, "codec", 3, plan_dir)  # warm-up
        for concurrency in args.concurrency:
            for mode in ("pcm", "codec"):
                print(f"[bench] {mode} x{concurrency} ...", flush=True)
                results: list = [None] * concurrency

                def run(index: int, mode: str = mode, results: list = results) -> None:
                    results[index] = one_stream(server.url, mode, args.frames, plan_dir)

                threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                rows.append({"concurrency": concurrency, "mode": mode, "streams": results})
    write_json(args.out / "serve.json", {"random_weights": True, "frames": args.frames, "rows": rows})

    def mean(row, key):
        values = [s[key] for s in row["streams"] if s[key] is not None]
        return float(np.mean(values)) if values else float("nan")

    print(f"\nServing on loopback, tiny talker + small decoder, RANDOM WEIGHTS, {args.frames} frames per stream")
    headers = ("streams", "mode", "first frame (s)", "first audio (s)", "frames/s per stream", "wire B per s of speech")
    lines = [
        (
            row["concurrency"], row["mode"], number(mean(row, "first_frame_s")), number(mean(row, "first_audio_s")),
            number(mean(row, "frames_per_s"), 1), number(mean(row, "wire_bytes_per_speech_s"), 0),
        )
        for row in rows
    ]  # fmt: skip
    print(table(headers, lines, align="rlrrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
