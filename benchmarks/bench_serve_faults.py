"""The server under faults: a mixed load at rising client counts, the engine killed or SIGTERM sent mid-load.

    .venv-vllm/bin/python -m benchmarks.bench_serve_faults --out out/bench [--clients 4 8 16]

RANDOM WEIGHTS (a tiny-talker checkpoint at the small decoder geometry, under ``--out``). For each client count
and each fault (``none``, ``engine killed``, ``SIGTERM``), a fresh ``vllm serve --omni --edge-hardware cpu_x86_64
--api-key KEY`` on 127.0.0.1: each kind of stream is first sent alone (its reference, greedy), then all clients at
once, the kinds in turn: codec frames over HTTP, PCM streamed over HTTP, server-sent events, upstream's WebSocket
(PCM). Once half the clients heard their first audio (and a second into the load), the fault: the EngineCore
process killed (SIGKILL), or SIGTERM to the server; half a second later one more client (PCM) comes. Each client's
outcome is one of:

* ``completed``: the whole stream, equal to its kind's reference;
* ``refused``: told to go elsewhere before any audio (HTTP 503, WebSocket close 1001 or 1013);
* ``errored``: the client read an error (an error message, a close other than 1000, a cut HTTP body);
* ``silent``: the client read a success whose audio is not the reference's (a short stream taken for a whole
  one): the one outcome a speech server must never give.

The table: completed / refused / errored / silent per fault and client count, the server's exit code and seconds
from the fault to its exit, first-audio p50 and p99 (and their ratio to the fault-free run of the same count).
During the run ``/metrics`` is read every half second: ``speech_dashboard.png`` draws the speech metrics'
panels (``examples/grafana/speech_dashboard.json``) from it. Writes ``serve_faults.json`` and ``serve_faults.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.harness import BenchmarkError, ensure_checkpoint, number, plot, run_cli, table, vllm_server, write_json

KEY = "bench-faults-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAULTS = ("none", "engine killed", "SIGTERM")
KINDS = ("codec", "pcm", "sse", "socket")
OUTCOMES = ("completed", "refused", "errored", "silent")
BODY = {"input": "Hello there, this is a test of the serving path under faults.", "voice": "Ryan"}
BODY |= {"language": "English", "greedy": True, "max_frames": 200}
SCRAPE_EVERY_S = 0.5
FAULT_AFTER_S = 1.0  # the fault comes once half the clients heard audio, and no sooner than this into the load
LATE_AFTER_S = 0.5  # a last client starts this long after the fault
EXIT_WAIT_S = 120


def request_body(kind: str) -> dict:
    return {
        "codec": {**BODY, "response_format": "codec", "edge_hardware": "cpu_x86_64"},
        "pcm": {**BODY, "response_format": "pcm", "stream_format": "audio"},
        "sse": {**BODY, "response_format": "pcm", "stream_format": "sse"},
    }[kind]


class Client(threading.Thread):
    """One client of ``kind``: ``heard`` once its first audio came (``first_audio_s`` after it started), then its
    ``outcome`` and ``audio`` (the whole body, or the socket's PCM)."""

    def __init__(self, url: str, kind: str) -> None:
        super().__init__(daemon=True)
        self.url, self.kind = url, kind
        self.heard = threading.Event()
        self.first_audio_s: float | None = None
        self.outcome, self.audio, self.detail = "errored", b"", ""

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.audio, self.outcome = self.socket(started) if self.kind == "socket" else self.http(started)
        except Exception as error:  # what the client saw
            self.detail = f"{type(error).__name__}: {error}"
        finally:
            self.heard.set()

    def first(self, started: float) -> None:
        if self.first_audio_s is None:
            self.first_audio_s = time.monotonic() - started
            self.heard.set()

    def http(self, started: float) -> tuple[bytes, str]:
        import httpx

        chunks = []
        with httpx.stream(
            "POST", self.url + "/v1/audio/speech", json=request_body(self.kind), headers=AUTH, timeout=300
        ) as response:
            if response.status_code == 503:
                return b"", "refused"
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}")
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                self.first(started)
        data = b"".join(chunks)
        if self.kind == "sse" and b"speech.audio.done" not in data:
            return data, "errored"
        if self.kind == "codec" and b'"reason":"complete"' not in data.replace(b" ", b""):
            return data, "errored"
        return data, "completed"

    def socket(self, started: float) -> tuple[bytes, str]:
        from websockets.sync.client import connect

        url = self.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        audio, errors = [], []
        with connect(url, additional_headers=AUTH, open_timeout=60) as socket:
            config = {"type": "session.config", "response_format": "pcm", "stream_audio": True}
            config |= {key: BODY[key] for key in ("voice", "language", "greedy", "max_frames")}
            messages = (config, {"type": "input.text", "text": BODY["input"]}, {"type": "input.done"})
            for message in (*messages, {"type": "session.close"}):
                socket.send(json.dumps(message))
            with contextlib.suppress(Exception):
                while True:
                    message = socket.recv(timeout=300)
                    if isinstance(message, bytes):
                        audio.append(message)
                        self.first(started)
                    elif json.loads(message)["type"] == "error":
                        errors.append(json.loads(message)["message"])
            code = socket.close_code
        if code in (1001, 1013) and not audio:
            return b"", "refused"
        return b"".join(audio), "completed" if code == 1000 and not errors else "errored"


def references(url: str) -> dict[str, bytes]:
    """Each kind sent alone: the audio a completed client must equal."""
    found = {}
    for kind in KINDS:
        client = Client(url, kind)
        client.run()
        if client.outcome != "completed":
            raise BenchmarkError(f"the {kind} reference ended {client.outcome}: {client.detail}")
        found[kind] = client.audio
    return found


def comparable(kind: str, audio: bytes) -> bytes:
    """What must equal the reference: a codec stream's frames messages and done without its stream id, the SSE
    deltas, the PCM as it is."""
    if kind == "sse":
        events = [json.loads(line[6:]) for line in audio.decode().splitlines() if line.startswith("data: ")]
        return "".join(event.get("audio", "") for event in events if event["type"] == "speech.audio.delta").encode()
    if kind == "codec":
        import io

        from vllm_omni.edge.stream import FrameBatch, iter_events

        frames = [e.frames for e in iter_events(io.BytesIO(audio)) if isinstance(e, FrameBatch) and len(e.frames)]
        return np.concatenate(frames).tobytes() if frames else b""
    return audio


class Scraper(threading.Thread):
    """``/metrics`` every :data:`SCRAPE_EVERY_S`: the speech metrics' samples with their times."""

    def __init__(self, url: str, started: float) -> None:
        super().__init__(daemon=True)
        self.url, self.started, self.samples, self.stop = url, started, [], threading.Event()

    def run(self) -> None:
        while True:
            request = urllib.request.Request(self.url + "/metrics", headers=AUTH)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    text = response.read().decode()
            except (OSError, urllib.error.URLError):
                text = None  # the server is gone, or going
            if text is not None:
                rows = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("vllm_omni_speech_"))
                self.samples.append({"t": time.monotonic() - self.started, **{k: float(v) for k, v in rows.items()}})
            if self.stop.wait(SCRAPE_EVERY_S):
                return


def engine_core_pid(server_pid: int) -> int:
    import psutil

    for child in psutil.Process(server_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child.pid
    raise BenchmarkError("no EngineCore process under the server")


def run_case(checkpoint: Path, work: Path, clients: int, fault: str) -> dict:
    """One server, ``clients`` at once, ``fault`` once half of them heard audio: the outcomes and timings."""
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--api-key", KEY, "--served-model-name", "qwen3-tts"]
    with vllm_server(checkpoint, work / "artifacts", work / "server.log", extra) as server:
        expected = {kind: comparable(kind, audio) for kind, audio in references(server.url).items()}
        started = time.monotonic()
        scraper = Scraper(server.url, started)
        scraper.start()
        load = [Client(server.url, KINDS[index % len(KINDS)]) for index in range(clients)]
        for client in load:
            client.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (
            sum(client.heard.is_set() for client in load) < (clients + 1) // 2
            or time.monotonic() - started < FAULT_AFTER_S
        ):
            time.sleep(0.02)
        fault_at = time.monotonic()
        if fault == "engine killed":
            os.kill(engine_core_pid(server.process.pid), signal.SIGKILL)
        elif fault == "SIGTERM":
            server.process.send_signal(signal.SIGTERM)
        time.sleep(LATE_AFTER_S)  # one client more, after the fault: refused by a draining server
        load.append(Client(server.url, "pcm"))
        load[-1].start()
        for client in load:
            client.join(300)
        exit_code = exit_s = None
        if fault != "none":
            with contextlib.suppress(Exception):
                exit_code = server.process.wait(timeout=EXIT_WAIT_S)
                exit_s = time.monotonic() - fault_at
        scraper.stop.set()
        scraper.join(5)
    for client in load:
        if client.outcome == "completed" and comparable(client.kind, client.audio) != expected[client.kind]:
            client.outcome = "silent"
    first = [client.first_audio_s for client in load if client.first_audio_s is not None]
    return {
        "clients": clients,
        "fault": fault,
        "outcomes": {
            name: sum(c.outcome == name for c in load) for name in ("completed", "refused", "errored", "silent")
        },
        "details": sorted({c.detail for c in load if c.detail}),
        "exit_code": exit_code,
        "exit_s": exit_s,
        "first_audio_p50_s": float(np.percentile(first, 50)) if first else None,
        "first_audio_p99_s": float(np.percentile(first, 99)) if first else None,
        "metrics": scraper.samples,
        "fault_at_s": fault_at - started,
    }


def report_rows(cases: list[dict]) -> list[list[str]]:
    baseline = {case["clients"]: case["first_audio_p50_s"] for case in cases if case["fault"] == "none"}
    rows = []
    for case in cases:
        outcomes, p50 = case["outcomes"], case["first_audio_p50_s"]
        ratio = p50 / baseline[case["clients"]] if p50 and baseline.get(case["clients"]) else None
        rows.append([
            case["fault"], str(case["clients"]), *(str(outcomes[name]) for name in outcomes),
            "-" if case["exit_code"] is None else str(case["exit_code"]), number(case["exit_s"], 1),
            number(p50, 3), number(case["first_audio_p99_s"], 3), number(ratio, 2),
        ])  # fmt: skip
    return rows


def dashboard_case(cases: list[dict]) -> dict:
    """The run the picture shows: the largest SIGTERM run (every panel moves in it)."""
    return next((case for case in reversed(cases) if case["fault"] == "SIGTERM"), cases[-1])


def draw_dashboard(pyplot, case: dict):
    """The dashboard's panels (``examples/grafana/speech_dashboard.json``) from one run's scraped metrics."""
    samples = case["metrics"]
    times = [sample["t"] for sample in samples]

    def series(prefix: str) -> list[float]:
        return [sum(v for k, v in sample.items() if k.startswith(prefix)) for sample in samples]

    figure, axes = pyplot.subplots(2, 2, figsize=(10, 6))
    panels = [
        ("Streams and sessions open", ["vllm_omni_speech_streams_open", "vllm_omni_speech_sessions_open"]),
        ("Speech sent (audio seconds)", ["vllm_omni_speech_audio_seconds_total"]),
        ("Refusals (total)", ["vllm_omni_speech_refusals_total"]),
        ("Failures (total)", ["vllm_omni_speech_failures_total"]),
    ]
    for axis, (title, prefixes) in zip(axes.flat, panels, strict=True):
        for prefix in prefixes:
            axis.plot(times, series(prefix), label=prefix.removeprefix("vllm_omni_speech_"))
        axis.axvline(case["fault_at_s"], color="red", linestyle="--", linewidth=1, label=case["fault"])
        axis.set_title(title)
        axis.set_xlabel("seconds")
        axis.legend(fontsize=7)
    figure.suptitle(f"Speech metrics, {case['clients']} clients, {case['fault']} (random weights, 2-core CPU)")
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--dashboard", type=Path, default=None, help="also draw the dashboard picture here")
    parser.add_argument("--draw-from", type=Path, default=None, help="only draw the picture from a run's JSON")
    args = parser.parse_args()
    if args.draw_from is not None:  # the main venv drawing for the serving venv, which has no matplotlib
        shown = dashboard_case(json.loads(args.draw_from.read_text())["cases"])
        plot(args.dashboard, lambda pyplot: draw_dashboard(pyplot, shown))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint(args.out / "ckpt-talker", "small", talker="tiny")
    cases = []
    for clients in args.clients:
        for fault in FAULTS:
            print(f"[bench] {clients} clients, fault: {fault}", flush=True)
            work = args.out / "serve_faults" / f"{clients}-{fault.replace(' ', '-')}"
            cases.append(run_case(checkpoint, work, clients, fault))
    headers = ["fault", "clients", "completed", "refused", "errored", "silent", "exit", "exit s", "first audio p50 s",
               "p99 s", "p50 / no fault"]  # fmt: skip
    text = table(headers, report_rows(cases))
    write_json(args.out / "serve_faults.json", {"cases": cases, "note": "RANDOM WEIGHTS, loopback, 2-core CPU"})
    (args.out / "serve_faults.md").write_text(text + "\n")
    print(text)
    shown = dashboard_case(cases)
    for path in filter(None, [args.out / "speech_dashboard.png", args.dashboard]):
        elsewhere = ["benchmarks.bench_serve_faults", "--draw-from", str(args.out / "serve_faults.json")]
        plot(path, lambda pyplot: draw_dashboard(pyplot, shown), elsewhere=[*elsewhere, "--dashboard", str(path)])
    silent = sum(case["outcomes"]["silent"] for case in cases)
    return 1 if silent else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
