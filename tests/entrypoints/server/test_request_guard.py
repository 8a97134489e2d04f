"""The request guard as ASGI middleware: refusals before any route, speech responses bounded per process and under a
send deadline, uvicorn's WebSocket settings at start-up."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from vllm_omni.entrypoints.server import request_guard
from vllm_omni.entrypoints.server.request_guard import RequestGuard
from vllm_omni.entrypoints.server.site_policy import SitePolicy


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


def guard(app, max_responses: int = 4) -> RequestGuard:
    return RequestGuard(app, SitePolicy(), ws_max_size=2048, max_responses=max_responses)


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
        assert guarded.responses == 0
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
