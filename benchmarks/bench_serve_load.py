"""Serving under a bounded load on loopback: many clients at once, each stream checked against its offline frames.

    .venv-vllm/bin/python -m benchmarks.bench_serve_load --out out/bench [--clients-scale 0.125]

RANDOM WEIGHTS (a tiny-talker checkpoint at the small decoder geometry, under ``--out``). One
``vllm serve --omni --edge-hardware cpu_x86_64 --api-key KEY`` on 127.0.0.1 (``harness.vllm_server``).
First, sequentially, the reference frames: each body below posted once alone (greedy decoding is
deterministic). Then, all at once:

* 64 streaming clients: ``POST /v1/audio/speech``, ``response_format: codec``, greedy, 30 frames; half
  one text and voice, half another;
* 16 clients of ``response_format: pcm, stream: false`` for 400 frames that close their socket after 1 s;
* 4 WebSocket clients (``/v1/audio/speech/stream``) sending a paragraph as token-sized pieces, leading
  spaces and whitespace-only pieces included, then ``end``;
* 0.5 s in, one client posting an 8 MB body (413 expected) and one a 100,000-deep nested JSON body (400);
* throughout, another process polling ``GET /health`` every 100 ms.

Checks (exit 1 when one fails): ``/health`` never slower than 1 s; every codec stream's frames equal
its reference; every WebSocket closes 1000 ``complete`` with one segment per sentence, each equal to
that sentence posted alone; the two bad bodies answered 413 and 400; ``vllm:num_requests_running``
back to 0 within 2 s of the last client leaving; the API server's RSS a few seconds after the load
within 10% of its RSS before. ``--clients-scale`` shrinks the client counts (development runs).
Writes ``serve_load.json`` and ``serve_load.md`` under ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.harness import BenchmarkError, drain, ensure_checkpoint, metric, run_cli, table, vllm_server, write_json

KEY = "bench-load-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
KV_CACHE_BYTES = 64 << 20  # the tiny talker keeps 1 KiB per token: room for every request at once
NUM_QUANTIZERS = 16
SPEECH_BODIES = (
    {"input": "Hello there, this is a test of the serving path.", "voice": "Ryan", "language": "English"},
    {"input": "Good morning, how are you today?", "voice": "Vivian", "language": "Auto"},
)
SOCKET_SENTENCES = (
    "Speech arrives in pieces, as a language model writes it.",
    "Each sentence becomes one segment!",
    "Is the last one spoken too?",
)
SOCKET_VOICES = (("Ryan", "English"), ("Vivian", "Auto"))
OVERSIZED_BYTES = 8 << 20
NESTING_DEPTH = 100_000
BAD_BODIES_AFTER_S = 0.5
DISCONNECT_AFTER_S = 1.0
HEALTH_PERIOD_S = 0.1

# The bars of issue 26.
MAX_HEALTH_S = 1.0
MAX_DRAIN_S = 2.0
MAX_RSS_CHANGE = 0.10


def socket_pieces() -> list[str]:
    """The paragraph as an LLM's token stream sends it: words with their leading spaces, and whitespace pieces."""
    pieces = ["", " "]
    for index, sentence in enumerate(SOCKET_SENTENCES):
        pieces += re.findall(r"\s*\S+", sentence)
        if index < len(SOCKET_SENTENCES) - 1:
            pieces += ["\n\n", ""]
    return [*pieces, " ", ""]


def codec_body(text: str, voice: str, language: str, frames: int) -> dict:
    return {
        "input": text,
        "voice": voice,
        "language": language,
        "greedy": True,
        "max_frames": frames,
        "response_format": "codec",
        "edge_hardware": "cpu_x86_64",
    }


def stream_frames(events: list) -> tuple[np.ndarray, str | None]:
    """All frames of a parsed codec stream, and its done reason."""
    from vllm_omni.edge.stream import FrameBatch, StreamDone

    frames = [event.frames for event in events if isinstance(event, FrameBatch) and len(event.frames)]
    done = next((event.reason for event in events if isinstance(event, StreamDone)), None)
    return (np.concatenate(frames) if frames else np.zeros((0, NUM_QUANTIZERS), dtype=np.int64)), done


def post_codec(url: str, body: dict) -> np.ndarray:
    """One request alone, its frames (the reference the loaded server must reproduce)."""
    from vllm_omni.edge.stream import iter_events

    headers = {**AUTH, "Content-Type": "application/json"}
    request = urllib.request.Request(url + "/v1/audio/speech", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=300) as response:
        frames, done = stream_frames(list(iter_events(io.BytesIO(response.read()))))
    if done != "complete":
        raise BenchmarkError(f"the reference request ended {done!r}: {body}")
    return frames


def poll_health(url: str, stop, samples_path: str) -> None:
    """``GET /health`` every ``HEALTH_PERIOD_S`` until ``stop``; one JSON line per request (monotonic times).

    A process of its own, so its latencies are the server's and not this benchmark's event loop's."""
    with open(samples_path, "w") as out:
        next_at = time.monotonic()
        while not stop.is_set():
            sent = time.monotonic()
            try:
                with urllib.request.urlopen(url + "/health", timeout=30) as response:
                    response.read()
                    status = response.status
            except OSError as error:
                status = str(error)
            out.write(json.dumps({"t": sent, "latency_s": time.monotonic() - sent, "status": status}) + "\n")
            next_at += HEALTH_PERIOD_S
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic())  # a slow answer delays the grid, it does not burst


def api_server_process(server_pid: int, port: int):
    """The process of ``vllm serve``'s tree listening on ``port`` (the API server, not the engine core)."""
    import psutil

    root = psutil.Process(server_pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections):
            return process
    raise BenchmarkError(f"no process of the server (pid {server_pid}) listens on port {port}")


async def codec_client(session, url: str, body: dict, expected: np.ndarray) -> dict:
    from vllm_omni.edge.stream import iter_events

    started = time.monotonic()
    first = None
    chunks = []
    try:
        async with session.post(url + "/v1/audio/speech", json=body, headers=AUTH) as response:
            status = response.status
            async for chunk in response.content.iter_any():
                first = first or time.monotonic()
                chunks.append(chunk)
        frames, done = stream_frames(list(iter_events(io.BytesIO(b"".join(chunks)))))
        problem = None
        if status != 200 or done != "complete":
            problem = f"status {status}, done {done!r}"
        elif not np.array_equal(frames, expected):
            problem = f"{len(frames)} frames differ from the {len(expected)} reference frames"
    except Exception as error:  # counted as a failed stream, with what went wrong
        status, frames, problem = None, np.zeros((0, NUM_QUANTIZERS)), f"{type(error).__name__}: {error}"
    ended = time.monotonic()
    return {
        "kind": "codec",
        "voice": body["voice"],
        "status": status,
        "first_byte_s": None if first is None else first - started,
        "seconds": ended - started,
        "frames": len(frames),
        "ok": problem is None,
        "problem": problem,
        "ended": ended,
    }


async def disconnecting_client(host: str, port: int, body: dict) -> dict:
    """A non-streamed PCM request whose client closes its socket after ``DISCONNECT_AFTER_S``."""
    started = time.monotonic()
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head.encode() + data)
    await writer.drain()
    try:
        answered = await asyncio.wait_for(reader.read(64), DISCONNECT_AFTER_S)
    except TimeoutError:
        answered = b""
    writer.close()  # the client leaves; the server must abort the engine request
    await writer.wait_closed()
    ended = time.monotonic()
    return {
        "kind": "pcm_disconnect",
        "status": answered.split(b"\r\n", 1)[0].decode(errors="replace") if answered else None,
        "seconds": ended - started,
        # an answer within the second means the request finished before the client left: nothing was aborted
        "ok": not answered,
        "problem": f"answered before the client left: {answered[:40]!r}" if answered else None,
        "ended": ended,
    }


async def socket_client(url: str, voice: str, language: str, frames: int, expected: list[np.ndarray]) -> dict:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, FrameBatch, iter_events, record

    started = time.monotonic()
    start = {"type": "start", "voice": voice, "language": language, "edge_hardware": "cpu_x86_64"}
    start |= {"greedy": True, "max_frames": frames}
    messages: list = []
    code = reason = problem = None
    segments: list[np.ndarray] = []
    try:
        ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with connect(ws_url, additional_headers=AUTH, open_timeout=120, max_size=None) as socket:
            await socket.send(json.dumps(start))
            for piece in socket_pieces():  # token-sized pieces, as a language model would send them
                await socket.send(json.dumps({"type": "text", "text": piece}))
                await asyncio.sleep(0.01)
            await socket.send(json.dumps({"type": "end"}))
            try:
                async for message in socket:
                    messages.append(message)
            except ConnectionClosed:
                pass
            code, reason = socket.close_code, socket.close_reason
        data = RECORDING_MAGIC + b"".join(
            record(KIND_BINARY, m) if isinstance(m, bytes) else record(KIND_JSON, m.encode()) for m in messages
        )
        current: list = []
        events = list(iter_events(io.BytesIO(data)))
        for event in events:
            if isinstance(event, FrameBatch):
                current += list(event.frames)
                if event.segment_end:
                    segments.append(np.asarray(current).reshape(-1, NUM_QUANTIZERS))
                    current = []
        done = stream_frames(events)[1]
        if (code, reason, done) != (1000, "complete", "complete"):
            problem = f"closed {code} {reason!r}, done {done!r}"
        elif len(segments) != len(expected):
            problem = f"{len(segments)} segments for {len(expected)} sentences"
        else:
            pairs = enumerate(zip(segments, expected, strict=True))
            wrong = [i for i, (got, want) in pairs if not np.array_equal(got, want)]
            problem = f"segments {wrong} differ from the sentences posted alone" if wrong else None
    except Exception as error:
        problem = f"{type(error).__name__}: {error}"
    ended = time.monotonic()
    return {
        "kind": "websocket",
        "voice": voice,
        "close": [code, reason],
        "segments": len(segments),
        "frames": int(sum(len(s) for s in segments)),
        "seconds": ended - started,
        "ok": problem is None,
        "problem": problem,
        "ended": ended,
    }


async def bad_body_client(session, url: str, kind: str, data: bytes, expected_status: int) -> dict:
    await asyncio.sleep(BAD_BODIES_AFTER_S)
    started = time.monotonic()
    headers = {**AUTH, "Content-Type": "application/json"}
    try:
        async with session.post(url + "/v1/audio/speech", data=data, headers=headers) as response:
            status, text = response.status, await response.text()
        problem = None if status == expected_status else f"answered {status}: {text[:200]}"
    except Exception as error:
        status, text, problem = None, "", f"{type(error).__name__}: {error}"
    ended = time.monotonic()
    return {
        "kind": kind,
        "bytes": len(data),
        "status": status,
        "expected_status": expected_status,
        "message": text[:300],
        "seconds": ended - started,
        "ok": problem is None,
        "problem": problem,
        "ended": ended,
    }


async def run_load(url: str, counts: dict[str, int], args, references: dict) -> tuple[float, list[dict]]:
    """Every client at once; the start time and each client's result."""
    import aiohttp

    host, port = url.removeprefix("http://").split(":")
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = []
        for index in range(counts["codec"]):
            which = index % len(SPEECH_BODIES)
            speech = SPEECH_BODIES[which]
            body = codec_body(speech["input"], speech["voice"], speech["language"], args.frames)
            tasks.append(codec_client(session, url, body, references["codec"][which]))
        for index in range(counts["pcm_disconnect"]):
            which = SPEECH_BODIES[index % len(SPEECH_BODIES)]
            body = {**which, "greedy": True, "max_frames": args.long_frames, "response_format": "pcm", "stream": False}
            tasks.append(disconnecting_client(host, int(port), body))
        for index in range(counts["websocket"]):
            voice, language = SOCKET_VOICES[index % len(SOCKET_VOICES)]
            tasks.append(socket_client(url, voice, language, args.socket_frames, references["socket"][voice]))
        oversized = b'{"input": "' + b"a" * (OVERSIZED_BYTES - 13) + b'"}'
        nested = b"[" * NESTING_DEPTH + b"]" * NESTING_DEPTH
        tasks.append(bad_body_client(session, url, "oversized_body", oversized, 413))
        tasks.append(bad_body_client(session, url, "nested_json", nested, 400))
        started = time.monotonic()
        return started, list(await asyncio.gather(*tasks))


def scaled_counts(scale: float) -> dict[str, int]:
    full = {"codec": 64, "pcm_disconnect": 16, "websocket": 4}
    return {kind: max(1, round(count * scale)) for kind, count in full.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--clients-scale", type=float, default=1.0, help="client counts x this (1: 64/16/4)")
    parser.add_argument("--frames", type=int, default=30, help="max_frames of each codec stream")
    parser.add_argument("--long-frames", type=int, default=400, help="max_frames of the clients that leave")
    parser.add_argument("--socket-frames", type=int, default=20, help="max_frames of each WebSocket segment")
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after the load before the RSS reading")
    args = parser.parse_args()

    counts = scaled_counts(args.clients_scale)
    work = args.out / "serve_load"
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint(work / "ckpt", "small", talker="tiny")
    extra = ("--api-key", KEY, "--kv-cache-memory-bytes", str(KV_CACHE_BYTES))
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    samples_path = work / "health.jsonl"
    with vllm_server(checkpoint, work / "artifacts", work / "server.log", extra) as server:
        url, port = server.url, server.port
        try:
            print("[bench] reference frames, one request at a time ...", flush=True)
            references = {
                "codec": [
                    post_codec(url, codec_body(b["input"], b["voice"], b["language"], args.frames))
                    for b in SPEECH_BODIES
                ],
                "socket": {
                    voice: [
                        post_codec(url, codec_body(s, voice, language, args.socket_frames)) for s in SOCKET_SENTENCES
                    ]
                    for voice, language in SOCKET_VOICES
                },
            }
            api_server = api_server_process(server.process.pid, port)
            time.sleep(2)
            rss_before = api_server.memory_info().rss
            generated_before = metric(url, "vllm:generation_tokens_total")
            poller = context.Process(target=poll_health, args=(url, stop, str(samples_path)), daemon=True)
            poller.start()
            time.sleep(2)  # the poller started (spawned) and its idle latencies first
            print(
                f"[bench] load: {counts} clients, an oversized and a nested body, /health every 100 ms ...", flush=True
            )
            load_started, clients = asyncio.run(run_load(url, counts, args, references))
            last_left = max(client["ended"] for client in clients)
            drained = drain(url, limit_s=60 - (time.monotonic() - last_left), every_s=0.05)
            drain_s = None if drained is None else time.monotonic() - last_left
            # one token per frame: the clients that left must not have had their 400 frames made anyway
            generated = metric(url, "vllm:generation_tokens_total") - generated_before
            time.sleep(args.settle_s)
            rss_after = api_server.memory_info().rss
            stop.set()
            poller.join(timeout=60)
        finally:
            stop.set()

    health = [json.loads(line) for line in samples_path.read_text().splitlines()]
    latencies = [sample["latency_s"] for sample in health]
    during = [s["latency_s"] for s in health if load_started <= s["t"] <= last_left]
    health_failures = [s for s in health if s["status"] != 200]
    by_kind: dict[str, list[dict]] = {}
    for client in clients:
        by_kind.setdefault(client["kind"], []).append(client)
    rss_change = (rss_after - rss_before) / rss_before
    received = sum(c.get("frames", 0) for c in clients)
    # One engine token per frame: what the clients that left would have cost had they run to the end.
    abandoned = counts["pcm_disconnect"] * args.long_frames
    checks = [
        {
            "check": "/health max latency (whole run)",
            "measured": f"{max(latencies):.3f} s over {len(latencies)} polls ({len(during)} during the load), "
            f"p50 {np.median(latencies) * 1e3:.0f} ms, {len(health_failures)} failed",
            "bar": f"< {MAX_HEALTH_S:g} s, none failed",
            "ok": max(latencies) < MAX_HEALTH_S and not health_failures,
        },
        *(
            {
                "check": f"{kind} clients as expected",
                "measured": f"{sum(c['ok'] for c in rows)}/{len(rows)}",
                "bar": {
                    "codec": "frames == reference, done complete",
                    "pcm_disconnect": f"no answer before leaving at {DISCONNECT_AFTER_S:g} s",
                    "websocket": "1000 complete, each segment == its sentence alone",
                    "oversized_body": "413",
                    "nested_json": "400",
                }[kind],
                "ok": all(c["ok"] for c in rows),
            }
            for kind, rows in by_kind.items()
        ),
        {
            "check": "num_requests_running back to 0 after the last client left",
            "measured": "still running after 60 s" if drain_s is None else f"{drain_s:.2f} s",
            "bar": f"< {MAX_DRAIN_S:g} s",
            "ok": drain_s is not None and drain_s < MAX_DRAIN_S,
        },
        {
            "check": "frames made for the PCM clients that left (engine frames - frames received)",
            "measured": f"{generated - received:.0f} of the {abandoned} they asked for",
            "bar": "under half: their requests were aborted",
            "ok": generated - received < abandoned / 2,
        },
        {
            "check": "API server RSS, before -> after the load",
            "measured": f"{rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB ({rss_change:+.1%})",
            "bar": f"within {MAX_RSS_CHANGE:.0%}",
            "ok": abs(rss_change) <= MAX_RSS_CHANGE,
        },
    ]

    def seconds(kind: str, key: str = "seconds") -> str:
        values = [c[key] for c in by_kind.get(kind, []) if c.get(key) is not None]
        return f"{np.mean(values):.2f} / {np.max(values):.2f}" if values else "-"

    load_s = last_left - load_started
    lines = [
        f"Serving under load on loopback, tiny talker + small decoder, RANDOM WEIGHTS; {counts['codec']} codec "
        f"streams ({args.frames} frames), {counts['pcm_disconnect']} PCM clients leaving after "
        f"{DISCONNECT_AFTER_S:g} s ({args.long_frames} frames asked), {counts['websocket']} WebSockets "
        f"({len(SOCKET_SENTENCES)} sentences, {args.socket_frames} frames each), an 8 MB and a "
        f"{NESTING_DEPTH:,}-deep body; load {load_s:.1f} s; {generated:.0f} frames made by the engine, "
        f"{received} received by the streaming clients",
        "",
        table(
            ("check", "measured", "bar", "pass"),
            ((c["check"], c["measured"], c["bar"], "yes" if c["ok"] else "NO") for c in checks),
            align="llll",
        ),
        "",
        table(
            ("clients", "count", "ok", "first byte mean / max (s)", "seconds mean / max"),
            (
                (kind, len(rows), sum(c["ok"] for c in rows), seconds(kind, "first_byte_s"), seconds(kind))
                for kind, rows in by_kind.items()
            ),
        ),
    ]
    problems = [f"- {c['kind']}: {c['problem']}" for c in clients if c["problem"]]
    if problems:
        more = [f"- ... {len(problems) - 20} more"] if len(problems) > 20 else []
        lines += ["", "Problems:", *problems[:20], *more]
    text = "\n".join(lines)
    report = {
        "random_weights": True,
        "counts": counts,
        "frames": args.frames,
        "long_frames": args.long_frames,
        "socket_frames": args.socket_frames,
        "load_seconds": load_s,
        "drain_seconds": drain_s,
        "engine_frames_generated": generated,
        "frames_received_by_streaming_clients": received,
        "api_server_rss_bytes": {"before": rss_before, "after": rss_after, "change": rss_change},
        "health": {
            "polls": len(latencies),
            "max_latency_s": max(latencies),
            "max_latency_during_load_s": max(during, default=None),
            "p50_latency_s": float(np.median(latencies)),
            "p99_latency_s": float(np.quantile(latencies, 0.99)),
            "failures": health_failures[:20],
            "samples": [{**s, "t": s["t"] - load_started} for s in health],
        },
        "checks": checks,
        "clients": [{key: value for key, value in c.items() if key != "ended"} for c in clients],
    }
    write_json(args.out / "serve_load.json", report)
    (args.out / "serve_load.md").write_text(text + "\n")
    print("\n" + text)
    failed = [c["check"] for c in checks if not c["ok"]]
    if failed:
        print(f"\nFAILED: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
