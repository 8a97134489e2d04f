"""A streamed speech body cut after its headers reads as an error in the client, never as a short success.

A real uvicorn serving the request guard over a route whose audio fails mid-stream (the engine's failure, as
``streamed`` meets it), read by httpx and by the OpenAI SDK's streaming call; a body that ends normally reads whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from vllm_omni.entrypoints.openai.speech_http import closing_response
from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits
from vllm_omni.entrypoints.server.in_flight import InFlightBounds
from vllm_omni.entrypoints.server.request_guard import RequestGuard
from vllm_omni.entrypoints.server.site_policy import SitePolicy
from vllm_omni.entrypoints.server.speech_streams import streamed

pytestmark = pytest.mark.vllm  # uvicorn, FastAPI, httpx and the OpenAI SDK: the serving venv's

CHUNK = b"\x01\x02" * 4800  # 0.2 s of 24 kHz PCM16


class EngineDied(RuntimeError):
    pass


async def audio(chunks: int, fails: bool) -> AsyncIterator[bytes]:
    for _ in range(chunks):
        yield CHUNK
        await asyncio.sleep(0.01)
    if fails:
        raise EngineDied("the engine core died")


def app():
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/audio/speech")
    async def speech(fails: bool = True):
        return closing_response(streamed(audio(5, fails)), "audio/pcm")

    in_flight = InFlightBounds.for_limits(SpeechLimits())
    app.add_middleware(RequestGuard, policy=SitePolicy(), ws_max_size=4096, in_flight=in_flight)
    return app


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def read_with_httpx(url: str) -> bytes:
    import httpx

    with httpx.stream("POST", url, json={"input": "Hello."}, timeout=30) as response:
        assert response.status_code == 200
        return b"".join(response.iter_bytes())


def test_a_cut_audio_stream_is_an_error_in_httpx_and_a_whole_one_is_not(server_url):
    import httpx

    assert read_with_httpx(server_url + "/v1/audio/speech?fails=false") == CHUNK * 5
    with pytest.raises(httpx.RemoteProtocolError):
        read_with_httpx(server_url + "/v1/audio/speech")


def test_a_cut_audio_stream_is_an_error_in_the_openai_sdk(server_url):
    import openai

    client = openai.OpenAI(base_url=server_url + "/v1", api_key="none", max_retries=0)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Hello.", response_format="pcm", extra_query={"fails": "false"}
    ) as response:
        assert b"".join(response.iter_bytes()) == CHUNK * 5
    # The SDK's own HTTP stack (httpx2 in openai 3.x) raises its RemoteProtocolError: the body was cut.
    with contextlib.ExitStack() as stack, pytest.raises(Exception, match="incomplete chunked read"):
        response = stack.enter_context(
            client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="Hello.", response_format="pcm"
            )
        )
        b"".join(response.iter_bytes())
