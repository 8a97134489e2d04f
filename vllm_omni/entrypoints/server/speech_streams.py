"""The bodies a speech request answers with: the codec stream (wire protocol), audio decoded here, or
server-sent events of that audio.

Each is an async iterator of bytes that follows the talker: frames leave as the engine makes them. CPU
work (decoding, encoding) runs on the state's bounded decode pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .edge_state import EdgeServingState

if TYPE_CHECKING:
    from vllm_omni.edge.plan.model import ExecPlan

logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply


async def frame_batches(
    frames: AsyncIterator[np.ndarray], per_message: int, flush_after_s: float | None = None
) -> AsyncIterator[np.ndarray]:
    """``frames`` (arrays of new frames, as the engine makes them) regrouped for the wire: the first frame
    leaves alone at once (first audio waits for nothing), then ``per_message`` frames at a time; the
    remainder leaves when the utterance ends, or (``flush_after_s``) when no frame came for that long: a talker
    held for text sends what it has made instead of keeping it until the text comes."""
    # Closing this closes the engine stream: its request is aborted.
    async with (
        contextlib.aclosing(frames),
        contextlib.aclosing(_regroup(frames, per_message, flush_after_s)) as batches,
    ):
        async for batch in batches:
            yield batch


async def _next_or_idle(frames: AsyncIterator[np.ndarray], timeout: float | None) -> AsyncIterator[Any]:
    """``frames`` again, with ``None`` yielded whenever ``timeout`` seconds pass without a new item (the wait for
    the item goes on: it is never cancelled, so the engine stream is not disturbed)."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(frames))
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


async def _regroup(
    frames: AsyncIterator[np.ndarray], per_message: int, flush_after_s: float | None
) -> AsyncIterator[np.ndarray]:
    from vllm_omni.edge.stream import message_batches

    pending: list[np.ndarray] = []
    held = 0
    first = True
    async with contextlib.aclosing(_next_or_idle(frames, flush_after_s)) as items:
        async for new in items:
            if new is None:  # idle: what is held leaves now
                if held:
                    yield np.concatenate(pending)
                    pending, held = [], 0
                continue
            if first and len(new):
                first = False
                yield new[:1]
                new = new[1:]
            if len(new):
                pending.append(new)
                held += len(new)
            if held >= per_message:
                joined = np.concatenate(pending)
                whole = held - held % per_message
                for piece in message_batches(joined[:whole], per_message):
                    yield piece
                pending = [joined[whole:]] if whole < held else []
                held -= whole
    if held:
        yield np.concatenate(pending)


async def codec_stream(
    edge: EdgeServingState, plan: ExecPlan, prepared: Any, request_id: str, per_message: int
) -> AsyncIterator[bytes]:
    """The wire protocol as an HTTP body: magic, start, frames messages as the talker makes frames, done."""
    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, StreamStart, record
    from vllm_omni.edge.stream.encoder import CodecStreamEncoder

    encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=request_id))
    yield RECORDING_MAGIC + record(KIND_JSON, encoder.start())
    try:
        async for frames in frame_batches(edge.generator.stream_prepared(prepared, request_id), per_message):
            yield record(KIND_BINARY, encoder.frames(frames))
    except Exception as error:  # the stream says what went wrong; the client keeps the audio so far
        yield record(KIND_JSON, encoder.done(reason="error", error=public_error(error)))
        return
    empty = np.zeros((0, plan.codec.num_quantizers), dtype=np.int64)
    yield record(KIND_BINARY, encoder.frames(empty, end_of_stream=True))
    yield record(KIND_JSON, encoder.done())


async def audio_stream(
    edge: EdgeServingState, prepared: Any, request_id: str, fmt: str, speed: float, counts: dict[str, int] | None = None
) -> AsyncIterator[bytes]:
    """The utterance in ``fmt`` (:mod:`..openai.speech_audio`), decoded on the server with the exact stateful
    decoder as frames arrive and encoded chunk by chunk, all on the decode pool; empty chunks are not
    yielded. ``counts["frames"]`` (when given) counts the frames decoded. Raises what the engine or the
    decoder raised (callers answer with :func:`public_error`)."""
    from vllm_omni.edge.audio import float_to_pcm16
    from vllm_omni.edge.runtime import open_decoder

    from ..openai.speech_audio import AudioEncoder

    sample_rate = edge.plans.server_decoder.codec.sample_rate

    def begin() -> tuple[Any, Any]:
        decoder = open_decoder(edge.plans.server_decoder, check_sha256=False, prepack=True)
        return decoder, AudioEncoder(fmt, sample_rate, speed)

    decoder, encoder = await edge.decode(begin)

    def step(frames: np.ndarray | None) -> bytes:
        audio = decoder.feed(frames) if frames is not None else decoder.flush()
        data = encoder.encode(float_to_pcm16(audio).tobytes()) if audio.size else b""
        return data + (encoder.finish() if frames is None else b"")

    counts = counts if counts is not None else {}
    counts.setdefault("frames", 0)
    async with contextlib.aclosing(edge.generator.stream_prepared(prepared, request_id)) as frames:
        async for new in frames:
            counts["frames"] += len(new)
            if data := await edge.decode(step, new):
                yield data
    if data := await edge.decode(step, None):
        yield data


async def streamed(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``body`` as a streamed HTTP response: a failure after the headers left ends the body early and is
    logged as one line (a truncated stream is all a client can be told then; no traceback)."""
    try:
        async for chunk in body:
            yield chunk
    except Exception as error:
        public_error(error)  # logs it
    finally:
        await body.aclose()


async def sse_events(
    edge: EdgeServingState, prepared: Any, request_id: str, fmt: str, speed: float
) -> AsyncIterator[bytes]:
    """The audio of :func:`audio_stream` as OpenAI's speech server-sent events: ``speech.audio.delta``
    (base64 audio) per chunk, then ``speech.audio.done`` with the usage (prompt positions in, codec frames
    out); a failure ends the stream with an ``error`` event."""
    counts: dict[str, int] = {}
    try:
        async for chunk in audio_stream(edge, prepared, request_id, fmt, speed, counts):
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode("ascii")})
    except Exception as error:
        yield _event({"type": "error", "error": {"message": public_error(error)}})
        return
    tokens_in, tokens_out = len(prepared.prompt_ids), counts["frames"]
    usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    yield _event({"type": "speech.audio.done", "usage": usage})


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def public_error(error: BaseException) -> str:
    """What a client is told of a failure inside the server: its kind and our own message, never a trace."""
    from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

    if isinstance(error, SpeechRequestError):
        return str(error)
    logger.warning("speech request failed: %s: %s", type(error).__name__, error, exc_info=logger.isEnabledFor(10))
    return f"the server failed while speaking ({type(error).__name__}: see the server log)"
