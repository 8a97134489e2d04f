"""The request guard as ASGI middleware: refusals before any route, speech responses bounded per process and under a
send deadline, uvicorn's WebSocket settings at start-up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from types import SimpleNamespace

import pytest

from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits
from vllm_omni.entrypoints.server import lifecycle as lifecycle_module
from vllm_omni.entrypoints.server import request_guard
from vllm_omni.entrypoints.server.in_flight import BatchItems, InFlight, InFlightBounds
from vllm_omni.entrypoints.server.lifecycle import Lifecycle, record_signals
from vllm_omni.entrypoints.server.request_guard import RequestGuard, api_keys
from vllm_omni.entrypoints.server.site_policy import SitePolicy

pytestmark = pytest.mark.vllm  # the guard counts its refusals with prometheus_client: the serving venv


def scope(path: str, method: str = "POST", headers: dict | None = None, kind: str = "http") -> dict:
    given = {"host": "127.0.0.1:8000", "content-type": "application/json", **(headers or {})}
    return {
        "type": kind,
        "method": method,
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in given.items() if v is not None],
    }


class Recorder:
    def __init__(self, block_body: bool = False) -> None:
        self.messages: list[dict] = []
        self.block_body = block_body

    async def __call__(self, message: dict) -> None:
        if self.block_body and message["type"] == "http.response.body":
            await asyncio.Event().wait()  # a client that never reads
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    def body(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.messages[1:]))


async def receive() -> dict:
    await asyncio.Event().wait()
    return {}


def guard(app, max_responses: int = 4, max_voice_uploads: int = 4, metrics_keys: tuple = ()) -> RequestGuard:
    limits = SpeechLimits(max_responses=max_responses, max_voice_uploads=max_voice_uploads)
    in_flight = InFlightBounds.for_limits(limits)
    return RequestGuard(app, SitePolicy(), ws_max_size=2048, in_flight=in_flight, metrics_keys=metrics_keys)


async def ok_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"audio"})


def run(guarded: RequestGuard, request: dict, send=None) -> Recorder:
    send = send or Recorder()
    asyncio.run(guarded(request, receive, send))
    return send


def test_refusals_come_before_any_route():
    cases = [
        (scope("/v1/audio/voices", "GET", {"host": "rebind.example:8000"}), 403, "does not answer to the host"),
        (scope("/v1/audio/speech", headers={"content-type": "text/plain"}), 415, "send application/json"),
        (scope("/v1/audio/speech", headers={"origin": "http://evil.example"}), 403, "--speech-allowed-origins"),
        (scope("/v1/audio/voices/x", "DELETE", {"origin": "null"}), 403, "may not read from this server, change"),
        (scope("/v1/audio/voices", "GET", {"origin": "http://evil.example"}), 403, "may not read from this server"),
    ]
    for request, status, text in cases:
        sent = run(guard(ok_app), request)
        assert sent.status == status and text in sent.body()["error"]["message"], (request, sent.messages)
    voices = scope("/v1/audio/voices", headers={"content-type": "multipart/form-data; boundary=x"})
    assert run(guard(ok_app), voices).status == 200
    refused = run(
        guard(ok_app), scope("/v1/audio/speech/stream", "GET", {"origin": "http://evil.example"}, "websocket")
    )
    assert refused.messages == [{"type": "websocket.close", "code": 1008, "reason": ""}]


def test_speech_responses_in_flight_are_bounded_and_a_client_that_never_reads_is_let_go(monkeypatch):
    monkeypatch.setattr(request_guard, "SEND_DEADLINE_S", 0.2)

    async def scenario() -> None:
        guarded = guard(ok_app, max_responses=1)
        stuck = Recorder(block_body=True)
        first = asyncio.create_task(guarded(scope("/v1/audio/speech"), receive, stuck))
        await asyncio.sleep(0.05)
        busy = Recorder()
        await guarded(scope("/v1/audio/speech"), receive, busy)
        assert busy.status == 503 and (b"retry-after", b"1") in busy.messages[0]["headers"]
        assert "--speech-max-responses" in busy.body()["error"]["message"]
        await asyncio.wait_for(first, 5)  # the stalled send ends the response within the deadline
        assert guarded.in_flight.responses.count == 0
        again = Recorder()
        await guarded(scope("/v1/audio/speech"), receive, again)
        assert again.status == 200

    asyncio.run(scenario())


def test_uvicorns_websocket_settings_are_set_at_start_up():
    config = SimpleNamespace(ws_max_size=16 << 20, ws_per_message_deflate=True)
    app = SimpleNamespace(state=SimpleNamespace(server=SimpleNamespace(config=config)))

    async def lifespan_app(scope, receive, send) -> None:
        pass

    asyncio.run(guard(lifespan_app)({"type": "lifespan", "app": app}, receive, Recorder()))
    assert (config.ws_max_size, config.ws_per_message_deflate) == (2048, False)


def test_voice_uploads_in_flight_are_bounded_apart_from_speech():
    async def scenario() -> None:
        release = asyncio.Event()

        async def slow_app(scope, receive, send) -> None:
            await release.wait()
            await ok_app(scope, receive, send)

        guarded = guard(slow_app, max_responses=1, max_voice_uploads=1)
        upload = scope("/v1/audio/voices", headers={"content-type": "multipart/form-data; boundary=x"})
        first = asyncio.create_task(guarded(upload, receive, Recorder()))
        await asyncio.sleep(0.05)
        busy = Recorder()
        await guarded(upload, receive, busy)
        assert busy.status == 503 and (b"retry-after", b"1") in busy.messages[0]["headers"]
        assert "--speech-max-voice-uploads" in busy.body()["error"]["message"]
        speech = asyncio.create_task(guarded(scope("/v1/audio/speech"), receive, Recorder()))  # its own bound
        listing = Recorder()
        reading = asyncio.create_task(guarded(scope("/v1/audio/voices", "GET"), receive, listing))  # not an upload
        await asyncio.sleep(0.05)
        assert guarded.in_flight.responses.count == 1 and guarded.in_flight.uploads.count == 1
        release.set()
        await asyncio.wait_for(asyncio.gather(first, speech, reading), 5)
        assert listing.status == 200
        assert (guarded.in_flight.responses.count, guarded.in_flight.uploads.count) == (0, 0)

    asyncio.run(scenario())


def test_metrics_need_the_key_of_a_keyed_server():
    async def metrics_app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"vllm:num_requests_running 0"})

    keyed = guard(metrics_app, metrics_keys=("k1", "k2"))
    for path in ("/metrics", "/metrics/", "/metricsx"):
        for given in (None, "Bearer wrong", "k1", "Basic k1", "Bearer k1 "):
            sent = run(keyed, scope(path, "GET", {"authorization": given}))
            assert sent.status == 401 and "--speech-open-metrics" in sent.body()["error"]["message"], (path, given)
        for given in ("Bearer k1", "bearer k2"):
            assert run(keyed, scope(path, "GET", {"authorization": given})).status == 200
    assert run(guard(metrics_app), scope("/metrics", "GET")).status == 200  # keyless, or opened for a scraper
    assert api_keys(SimpleNamespace(api_key=["a", "b"])) == ("a", "b")
    assert api_keys(SimpleNamespace(api_key=None)) == ()


def test_a_batch_runs_at_once_only_the_items_the_bound_leaves_room_for():
    async def scenario(limit: int, others: int, items: int) -> int:
        responses = InFlight("speech responses", limit, "--speech-max-responses")
        responses.count = 1 + others  # the batch's own request and other requests in flight
        batch = BatchItems(responses)
        running = peak = 0

        async def item() -> None:
            nonlocal running, peak
            async with batch.slot():
                running += 1
                peak = max(peak, running)
                assert others + running <= limit  # engine requests at once: the others and this batch's items
                await asyncio.sleep(0.01)
                running -= 1

        await asyncio.gather(*(item() for _ in range(items)))
        assert responses.count == 1 + others
        return peak

    assert asyncio.run(scenario(limit=1, others=0, items=4)) == 1
    assert asyncio.run(scenario(limit=3, others=0, items=8)) == 3
    assert asyncio.run(scenario(limit=3, others=2, items=8)) == 1  # the bound is full: one item at a time
    assert asyncio.run(scenario(limit=64, others=0, items=5)) == 5


def test_while_draining_readiness_fails_and_new_work_is_refused_but_reads_go_on():
    lifecycle = Lifecycle()
    guarded = guard(ok_app)
    guarded.lifecycle = lifecycle
    assert run(guarded, scope("/health", "GET")).status == 200
    lifecycle.drain(signal.SIGTERM)
    health = run(guarded, scope("/health", "GET"))
    assert health.status == 503 and "shutting down" in health.body()["error"]["message"]
    for path in ("/v1/audio/speech", "/v1/audio/speech/batch"):
        refused = run(guarded, scope(path))
        assert refused.status == 503 and (b"retry-after", b"1") in refused.messages[0]["headers"]
        assert "send the request to another server" in refused.body()["error"]["message"]
    assert run(guarded, scope("/v1/audio/voices", "GET")).status == 200  # reads are not new work


def test_a_shutdown_signal_is_recorded_beside_the_loops_own_handler(monkeypatch):
    """The loop's handler (vLLM's: it starts the engine's drain) still runs once the lifecycle's is installed."""
    monkeypatch.setattr(lifecycle_module, "SHUTDOWN_SIGNALS", (signal.SIGUSR1,))

    async def scenario() -> bool:
        lifecycle = Lifecycle()
        loop_saw = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, loop_saw.set)  # as vLLM's launcher adds SIGTERM's
        try:
            record_signals(lifecycle)
            os.kill(os.getpid(), signal.SIGUSR1)
            await asyncio.wait_for(loop_saw.wait(), 5)
            return lifecycle.draining
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    assert asyncio.run(scenario()) is True


def test_an_engine_that_errors_unasked_is_a_failure_and_one_stopped_by_a_drain_is_not():
    dead = SimpleNamespace(errored=True)
    failed = Lifecycle()
    failed.check_engine(SimpleNamespace(errored=False))
    assert failed.engine_failure is None
    failed.check_engine(dead)
    assert "engine core died" in failed.engine_failure
    drained = Lifecycle()
    drained.drain(signal.SIGTERM)
    drained.check_engine(dead)
    assert drained.engine_failure is None
