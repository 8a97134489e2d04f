"""HTTP plumbing of the speech routes: a body read within its limit, work that stops when its client
leaves, conditional GETs, OpenAI's error body."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from .speech_api import SpeechApiError

# A body over the limit is still read (and dropped) up to this size, so the client can read the 413 rather
# than a connection reset mid-upload; past it the connection is cut.
DRAIN_BYTES = 64 << 20
BODY_SECONDS = 60.0
T = TypeVar("T")


async def read_body(request: Any, limit: int) -> bytes:
    """The request body, refused (413) when over ``limit`` bytes, by its ``Content-Length`` or as it
    arrives; nothing over the limit is kept (up to :data:`DRAIN_BYTES` is read and dropped)."""
    declared = request.headers.get("content-length")
    if declared is not None and not (declared.isascii() and declared.isdecimal()):
        raise SpeechApiError(400, f"Content-Length {declared!r} is not a byte count")
    chunks: list[bytes] = []
    size = 0
    if declared is None or int(declared) <= DRAIN_BYTES:
        try:
            async with asyncio.timeout(BODY_SECONDS):  # a body trickled in byte by byte holds nothing for long
                async for chunk in request.stream():
                    size += len(chunk)
                    if size <= limit:
                        chunks.append(chunk)
                    elif chunks:
                        chunks.clear()  # over the limit: the rest is read and dropped
                    if size > DRAIN_BYTES:
                        break
        except TimeoutError:
            raise SpeechApiError(408, f"the body did not arrive within {BODY_SECONDS:g} s") from None
    if size > limit or (declared is not None and int(declared) > limit):
        shown = declared if declared is not None else f"over {limit}"
        raise SpeechApiError(
            413, f"the body is {shown} bytes; this server takes at most {limit} (--speech-max-body-bytes)"
        )
    return b"".join(chunks)


async def collect_unless_disconnected(request: Any, body: AsyncIterator[bytes]) -> bytes | None:
    """All of ``body``, or ``None`` as soon as the client disconnects: the body's generator is cancelled
    then, which aborts its engine request (nobody will receive the audio)."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in body])

    done, result = await until_disconnected(request, collect())
    if not done:
        await body.aclose()
    return result


async def until_disconnected(request: Any, work: Awaitable[T]) -> tuple[bool, T | None]:
    """``(True, work's result)``, or ``(False, None)`` as soon as the client disconnects: ``work`` is cancelled
    then (its engine requests are aborted). Raises what ``work`` raises."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.create_task(disconnected())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for running in (task, watch):
            if not running.done():
                running.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task in done:
        return True, task.result()
    return False, None


def closing_response(body: AsyncIterator[bytes], media_type: str, headers: dict[str, str] | None = None) -> Any:
    """A streamed response of ``body`` that closes ``body`` however it ends (Starlette's leaves an unfinished
    iterator to the garbage collector): a client that stopped reading (the request guard's send deadline) or left
    aborts the engine request at once."""
    return _closing_response_class()(body, media_type=media_type, headers=headers)


@functools.cache
def _closing_response_class() -> type:
    from starlette.responses import StreamingResponse

    class ClosingStreamingResponse(StreamingResponse):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    await close()

    return ClosingStreamingResponse


def not_modified(request: Any, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (quoted) or is ``*``: the client's copy is current."""
    given = request.headers.get("if-none-match")
    if not given:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in given.split(",")}
    return "*" in tags or etag in tags


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "code": status}}


def retry_after(error: Any) -> dict[str, str]:
    """The ``Retry-After`` header of a refusal for now (a :class:`~vllm_omni.errors.RequestRefused` with
    ``retry_after_s``), or none."""
    seconds = getattr(error, "retry_after_s", None)
    return {} if seconds is None else {"Retry-After": str(max(1, round(seconds)))}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    """:func:`error_body` as a response with ``status``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(status, message), status_code=status, headers=headers)
