"""``vllm serve --omni`` without ``--api-key``, as a developer runs it on a workstation, against the web pages and
clients that would abuse it: DNS rebinding, cross-site writes, inflated WebSocket messages, a stream session held
open by flushes, a word without end, routes outside the key's guard; and started with a lower text limit, its own
clients (which cut their text by the limits it announces) kept.

A keyless server trusts whoever reaches it, so none of this may be reachable from a page the operator visits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import pytest

from ..serving import running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

IDLE_S = 3
MAX_INPUT_CHARS = 40  # below the default (4096), as an operator may start it: clients must learn it from the server
EXTRA_ARGS = ["--speech-allowed-hosts", "tts.test", "--speech-socket-idle-s", str(IDLE_S)]
EXTRA_ARGS += ["--speech-max-input-chars", str(MAX_INPUT_CHARS)]
MAX_RESPONSES = 2  # speech responses in flight: a batch of more items runs at most this many engine requests
EXTRA_ARGS += ["--speech-max-responses", str(MAX_RESPONSES)]
START = {"type": "start", "edge_hardware": "cpu_x86_64", "text_mode": "stream", "voice": "Ryan", "greedy": True}
SAY = {"input": "Hello.", "voice": "Ryan", "language": "English", "greedy": True, "max_frames": 4}


@pytest.fixture(scope="module")
def server(talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, shared_plans):
    work = tmp_path_factory.mktemp("serve-keyless")
    shared_plans.copy_to(talker_checkpoint, "cpu_x86_64", work / "artifacts" / "cpu_x86_64")
    with running_server(talker_checkpoint, work, "cpu_x86_64", EXTRA_ARGS, key=None) as server:
        yield server


def call(server, path: str, body: bytes | None = None, headers: dict | None = None, method: str | None = None):
    """``(status, headers, body)`` of one request (any status)."""
    request = urllib.request.Request(server.url + path, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def socket_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def port(server) -> str:
    return server.url.rsplit(":", 1)[1]


def test_a_rebound_name_is_refused_on_every_route_and_the_socket(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    rebound = f"rebind.example:{port(server)}"
    page = {"Host": rebound, "Origin": f"http://{rebound}"}
    for path in ("/v1/audio/voices", "/v1/edge/hardware", "/edge/browser/", "/health"):
        status, _, body = call(server, path, headers=page)
        assert status == 403 and b"does not answer to the host" in body, (path, status, body[:300])
    with pytest.raises(InvalidStatus) as refused:  # the page's own origin: same-origin with the rebound name
        connect(socket_url(server), additional_headers={"Host": rebound}, origin=f"http://{rebound}", open_timeout=60)
    assert refused.value.response.status_code == 403
    # The names it does answer to: an IP address, localhost, and the name an operator allowed.
    for host in (f"127.0.0.1:{port(server)}", f"localhost:{port(server)}", f"tts.test:{port(server)}"):
        status, _, body = call(server, "/v1/audio/voices", headers={"Host": host})
        assert status == 200 and "voices" in json.loads(body), (host, status)


def test_cross_site_writes_and_bodies_a_page_sends_without_preflight_are_refused(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    body = json.dumps(SAY).encode()
    status, _, answer = call(server, "/v1/audio/speech", body, {"Content-Type": "text/plain"})
    assert status == 415 and b"send application/json" in answer, (status, answer)
    evil = {"Content-Type": "application/json", "Origin": "http://evil.example"}
    for path in ("/v1/audio/speech", "/v1/audio/speech/batch", "/v1/audio/voices"):
        status, _, answer = call(server, path, b"{}", evil)
        assert status == 403 and b"--speech-allowed-origins" in answer, (path, status, answer)
    status, _, answer = call(server, "/v1/audio/voices/Ryan", None, {"Origin": "http://evil.example"}, "DELETE")
    assert status == 403, (status, answer)
    for path in ("/v1/audio/voices", "/v1/edge/plans/cpu_x86_64"):  # vLLM's CORS answers "*": no cross-site reads
        status, _, answer = call(server, path, None, {"Origin": "http://evil.example"})
        assert status == 403 and b"may not read from this server" in answer, (path, status, answer)
    for origin in ("http://evil.example", "null", f"https://http://127.0.0.1:{port(server)}"):
        with pytest.raises(InvalidStatus) as refused:
            connect(socket_url(server), origin=origin, open_timeout=60)
        assert refused.value.response.status_code == 403, origin
    # The server's own page, and a program that sends no Origin, are served.
    own = {"Content-Type": "application/json; charset=utf-8", "Origin": server.url}
    for headers in (own, {"Content-Type": "application/json"}):
        status, _, answer = call(
            server, "/v1/audio/speech", json.dumps({**SAY, "response_format": "pcm"}).encode(), headers
        )
        assert status == 200 and len(answer) > 0, (status, answer[:300])


def rss_bytes(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) * 1024


def test_websocket_messages_are_bounded_before_they_are_held_and_never_inflated(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    before = rss_bytes(server.process.pid)
    with connect(socket_url(server), compression="deflate", max_size=None, open_timeout=60) as socket_:
        assert not socket_.protocol.extensions, "the server agreed to per-message deflate"
        socket_.send(json.dumps(START))
        with pytest.raises(ConnectionClosed):
            socket_.send("x" * (16 << 20))  # 16 MiB, over --speech-max-body-bytes (1 MiB)
            socket_.recv(timeout=60)
            socket_.recv(timeout=60)
    # 1009 (message too big), or 1006 where the server's close crossed the client's sending and cut the connection
    assert socket_.close_code in (1009, 1006), (socket_.close_code, socket_.close_reason)
    grown = rss_bytes(server.process.pid) - before
    assert grown < 12 << 20, f"the server's memory grew {grown / 2**20:.1f} MiB for one refused message"


def metric(server, name: str) -> float:
    status, _, body = call(server, "/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines() if line.startswith(name))


def test_a_stream_session_kept_alive_by_flushes_alone_is_closed_at_the_idle_limit(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    started = time.monotonic()
    with connect(socket_url(server), open_timeout=60) as socket_:
        socket_.send(json.dumps(START))
        socket_.send(json.dumps({"type": "text", "text": "Hello there"}))
        with pytest.raises(ConnectionClosed):
            while time.monotonic() - started < 8 * IDLE_S:
                socket_.send(json.dumps({"type": "flush"}))  # every second: no text, so no life
                with contextlib.suppress(TimeoutError):
                    socket_.recv(timeout=1)
    assert socket_.close_code == 4408 and "idle" in socket_.close_reason, (socket_.close_code, socket_.close_reason)
    assert time.monotonic() - started < 4 * IDLE_S
    deadline = time.monotonic() + 30
    while metric(server, "vllm:num_requests_running") + metric(server, "vllm:num_requests_waiting") > 0 or metric(
        server, "vllm:kv_cache_usage_perc"
    ):
        assert time.monotonic() < deadline, "the idle session's engine request kept its KV cache"
        time.sleep(0.5)


def test_a_word_without_end_does_not_stall_the_event_loop(server):
    """8,000 one-character pieces with no space: each is tokenized off the event loop, the pending word bounded;
    ``/health`` answers within a bound meanwhile (the same bound as on an idle server, ten times over)."""
    from websockets.sync.client import connect

    def health_s() -> float:
        started = time.monotonic()
        status, _, _ = call(server, "/health")
        assert status == 200
        return time.monotonic() - started

    idle = max(health_s() for _ in range(10))
    latencies: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            latencies.append(health_s())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with connect(socket_url(server), open_timeout=60) as socket_:
            socket_.send(json.dumps(START))
            for _ in range(8000):
                socket_.send(json.dumps({"type": "text", "text": "a"}))
            socket_.send(json.dumps({"type": "end"}))
            try:
                while True:
                    socket_.recv(timeout=120)
            except Exception:
                pass
    finally:
        done.set()
        watcher.join()
    bound = max(2.0, 10 * idle)
    assert latencies and max(latencies) < bound, f"/health took {max(latencies):.2f} s (idle: {idle:.3f} s)"


def test_routes_outside_the_keys_guard_do_no_work(server):
    """Every POST route the server logged at start-up outside the paths ``--api-key`` guards: none generates,
    scales or reconfigures (``/invocations`` would run generation on a keyed server without its key)."""
    from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX

    routes = re.findall(r"Route: (\S+), Methods: ([A-Z, ]+)", server.log.read_text(errors="replace"))
    unguarded = sorted({path for path, methods in routes if "POST" in methods and not path.startswith(GUARDED_PREFIX)})
    assert "/invocations" in unguarded
    for path in unguarded:
        status, _, answer = call(server, path, b"{}", {"Content-Type": "application/json"})
        if path in ("/ping", "/health"):
            assert status == 200, path
        else:
            assert status == 404 and b"not served" in answer, (path, status, answer[:300])


def test_the_plan_names_the_model_not_the_servers_path(server, talker_checkpoint):
    status, _, body = call(server, "/v1/edge/plans/cpu_x86_64")
    plan = json.loads(body)
    assert status == 200 and plan["model"]["id"] == talker_checkpoint.name, plan["model"]
    assert os.sep not in plan["model"]["id"]


def test_a_server_started_with_a_lower_text_limit_announces_it_and_keeps_the_edge_clients_session(server, tmp_path):
    """The start message announces the limits the server was started with; the edge client (``--text-stdin``) cuts
    a text of twice the limit in one read by them, so the session it opens is spoken to the end, not closed."""
    from websockets.sync.client import connect

    with connect(socket_url(server), open_timeout=60) as socket_:
        socket_.send(json.dumps({**START, "max_frames": 2}))
        limits = json.loads(socket_.recv(timeout=120))["limits"]
        socket_.send(json.dumps({"type": "cancel"}))
    assert limits["max_input_chars"] == MAX_INPUT_CHARS and limits["socket_idle_s"] == IDLE_S, limits

    text = "Hello there, this sentence is longer than the forty characters one piece may have here."
    assert len(text) > 2 * MAX_INPUT_CHARS
    out = tmp_path / "speech.wav"
    command = [sys.executable, "-m", "vllm_omni.edge", "client", "--server", server.url, "--hardware", "cpu_x86_64"]
    command += ["--text-stdin", "--voice", "Ryan", "--language", "English", "--greedy", "--max-frames", "6"]
    command += ["--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    run = subprocess.run(command, input=text.encode(), capture_output=True, timeout=300)
    log = (run.stdout + run.stderr).decode(errors="replace")
    assert run.returncode == 0 and "closed the speech session" not in log, log[-3000:]
    with wave.open(str(out)) as handle:
        assert handle.getnframes() > 0, log[-3000:]


def test_a_batch_runs_no_more_engine_requests_at_once_than_the_in_flight_bound(server):
    """A batch of 6 items under --speech-max-responses 2: vLLM's own gauges (requests running and waiting) never
    count more than 2 while it runs, and every item is spoken."""
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(metric(server, "vllm:num_requests_running") + metric(server, "vllm:num_requests_waiting"))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    items = [{"input": f"Item number {index}, spoken.", "max_frames": 40} for index in range(6)]
    body = {"items": items, "voice": "Ryan", "language": "English", "greedy": True, "response_format": "pcm"}
    try:
        status, _, answer = call(
            server, "/v1/audio/speech/batch", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
    finally:
        done.set()
        watcher.join()
    assert status == 200 and json.loads(answer)["succeeded"] == 6, answer[:300]
    assert seen and max(seen) <= MAX_RESPONSES, f"engine requests at once: {max(seen)} > {MAX_RESPONSES}"
    assert max(seen) >= 1  # the gauges saw the batch's requests
