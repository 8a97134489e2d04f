"""The bodies a speech request answers with: the codec stream (wire protocol), audio decoded here, or
server-sent events of that audio.

Each is an async iterator of bytes that follows the talker: frames leave as the engine makes them. CPU
work (decoding, encoding) runs on the state's bounded decode pool, never on the event loop.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm_omni.errors import RequestRefused

from .lifecycle import LIFECYCLE
from .speech_metrics import Meter, speech_metrics
from .speech_service import SpeechService

if TYPE_CHECKING:
    from vllm_omni.edge.plan.model import ExecPlan

logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply


async def frame_batches(
    frames: AsyncIterator[np.ndarray], per_message: int, first: int = 1
) -> AsyncIterator[np.ndarray]:
    """``frames`` (arrays of new frames, as the engine makes them) regrouped for the wire: the first ``first``
    frames leave together as soon as they are made (one by default: first audio waits for nothing; upstream's
    ``initial_codec_chunk_frames``), then ``per_message`` frames at a time; the remainder leaves when the
    utterance ends, or when ``frames`` yields an empty batch (a streamed-text talker held for its text: it has
    sent every frame it can make until more text comes)."""
    from vllm_omni.edge.stream import message_batches

    pending: list[np.ndarray] = []
    held = 0
    first_left = first  # frames the first message still waits for
    async with contextlib.aclosing(frames):  # closing this closes the engine stream: its request is aborted
        async for new in frames:
            if not len(new):  # the talker waits for text: what is held leaves now
                if held:
                    yield np.concatenate(pending)
                    pending, held = [], 0
                    first_left = 0
                continue
            if first_left:
                pending.append(new[:first_left])
                held += len(pending[-1])
                new = new[first_left:]
                first_left -= len(pending[-1])
                if first_left:
                    continue
                yield np.concatenate(pending)
                pending, held = [], 0
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
    speech: SpeechService,
    plan: ExecPlan,
    prepared: Any,
    request_id: str,
    per_message: int,
    first: int = 1,
    *,
    meter: Meter,
) -> AsyncIterator[bytes]:
    """The wire protocol as an HTTP body: magic, start, frames messages as the talker makes frames (the first
    ``first`` together), done; ``meter`` measures it."""
    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, StreamStart, record
    from vllm_omni.edge.stream.encoder import CodecStreamEncoder

    encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=request_id))
    yield RECORDING_MAGIC + record(KIND_JSON, encoder.start())
    made = meter.frames(speech.generator.stream_prepared(prepared, request_id))
    try:
        async for frames in frame_batches(made, per_message, first=first):
            yield record(KIND_BINARY, encoder.frames(frames))
            meter.sent(len(frames))
    except Exception as error:  # the stream says what went wrong; the client keeps the audio so far
        yield record(KIND_JSON, encoder.done(reason="error", error=public_error(error)))
        return
    end, done = encoder.finish()
    yield record(KIND_BINARY, end)
    yield record(KIND_JSON, done)


async def audio_stream(
    speech: SpeechService,
    prepared: Any,
    request_id: str,
    fmt: str,
    speed: float,
    counts: dict[str, int] | None = None,
    first: int = 1,
    *,
    meter: Meter,
) -> AsyncIterator[bytes]:
    """The utterance of ``prepared`` as :func:`decoded_audio` (the first ``first`` frames decoded together);
    ``meter`` measures each chunk as it leaves."""
    frames = meter.frames(speech.generator.stream_prepared(prepared, request_id))
    if first > 1:
        frames = frame_batches(frames, 1, first=first)
    counts = counts if counts is not None else {}
    reported = 0
    async with contextlib.aclosing(decoded_audio(speech, frames, fmt, speed, counts)) as chunks:
        async for chunk in chunks:
            meter.sent(counts["frames"] - reported)
            reported = counts["frames"]
            yield chunk


async def decoded_audio(
    speech: SpeechService, frames: AsyncIterator[np.ndarray], fmt: str, speed: float, counts: dict[str, int] | None
) -> AsyncIterator[bytes]:
    """``frames`` in ``fmt`` (:mod:`..openai.speech_audio`), decoded on the server with the exact stateful decoder
    as they arrive and encoded chunk by chunk, all on the decode pool; empty chunks are not yielded.
    ``counts["frames"]`` (when given) counts the frames decoded. Raises what the engine or the decoder raised
    (callers answer with :func:`public_error`); closing it closes ``frames`` (the engine request is aborted)."""
    from vllm_omni.edge.audio import float_to_pcm16
    from vllm_omni.edge.runtime import open_decoder

    from ..openai.speech_audio import AudioEncoder

    sample_rate = speech.sample_rate

    def begin() -> tuple[Any, Any]:
        decoder = open_decoder(speech.server_decoder, check_sha256=False, prepack=True)
        return decoder, AudioEncoder(fmt, sample_rate, speed)

    async with contextlib.aclosing(frames):
        decoder, encoder = await speech.decode(begin)

        def step(new: np.ndarray | None) -> bytes:
            audio = decoder.feed(new) if new is not None else decoder.flush()
            data = encoder.encode(float_to_pcm16(audio).tobytes()) if audio.size else b""
            return data + (encoder.finish() if new is None else b"")

        counts = counts if counts is not None else {}
        counts.setdefault("frames", 0)
        async for new in frames:
            counts["frames"] += len(new)
            if data := await speech.decode(step, new):
                yield data
        if data := await speech.decode(step, None):
            yield data


def whole_file(data: bytes, fmt: str, sample_rate: int) -> bytes:
    """The body of a response sent whole: a WAV's header then carries its true length."""
    from ..openai.speech_audio import wav_header

    if fmt == "wav":
        return wav_header(len(data) - 44, sample_rate) + data[44:]
    return data


class StreamCut(Exception):
    """A streamed audio body that failed after its headers left. The response must then end without its last
    chunk (the request guard closes the connection: :mod:`.request_guard`), so that every HTTP client reads a
    truncated body, an error, never a short success; the message is :func:`public_error`'s."""


async def streamed(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``body`` as a streamed HTTP response of raw audio (PCM, WAV, MP3, Opus, AAC, FLAC: formats with no error
    message of their own): a failure after the headers left raises :class:`StreamCut`, logged as one line."""
    try:
        async for chunk in body:
            yield chunk
    except Exception as error:
        raise StreamCut(public_error(error)) from None  # public_error logs it
    finally:
        await body.aclose()


def usage(prepared: Any, frames: int) -> dict[str, Any]:
    """Upstream vLLM-Omni's usage of one utterance: text and instruction tokens plus in-context reference frames
    in, codec frames out."""
    tokens_in = prepared.text_tokens + prepared.audio_tokens
    return {
        "input_tokens": tokens_in,
        "output_tokens": frames,
        "total_tokens": tokens_in + frames,
        "input_token_details": {"text_tokens": prepared.text_tokens, "audio_tokens": prepared.audio_tokens},
    }


def usage_headers(usage: dict[str, Any]) -> dict[str, str]:
    """``usage`` as upstream's ``X-VLLM-OMNI-*-TOKENS`` response headers."""
    details = usage["input_token_details"]
    counts = {
        "INPUT": usage["input_tokens"],
        "OUTPUT": usage["output_tokens"],
        "TOTAL": usage["total_tokens"],
        "INPUT-TEXT": details["text_tokens"],
        "INPUT-AUDIO": details["audio_tokens"],
    }
    return {f"X-VLLM-OMNI-{name}-TOKENS": str(value) for name, value in counts.items()}


async def sse_events(
    speech: SpeechService,
    prepared: Any,
    request_id: str,
    fmt: str,
    speed: float,
    first: int = 1,
    *,
    meter: Meter,
) -> AsyncIterator[bytes]:
    """The audio of :func:`audio_stream` as server-sent events, as upstream vLLM-Omni and OpenAI name them:
    ``speech.audio.delta`` (base64 audio and its ``response_format``) per chunk, then ``speech.audio.done`` with
    the :func:`usage`; a failure ends the stream with ``speech.audio.error`` (OpenAI's error object)."""
    counts: dict[str, int] = {}
    try:
        async for chunk in audio_stream(speech, prepared, request_id, fmt, speed, counts, first, meter=meter):
            audio = base64.b64encode(chunk).decode("ascii")
            yield _event({"type": "speech.audio.delta", "audio": audio, "response_format": fmt})
    except Exception as error:
        body = {"message": public_error(error), "type": "server_error", "param": None, "code": 500}
        yield _event({"type": "speech.audio.error", "error": body})
        return
    yield _event({"type": "speech.audio.done", "usage": usage(prepared, counts["frames"])})


def _event(payload: dict) -> bytes:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return b"event: " + payload["type"].encode() + b"\ndata: " + data + b"\n\n"


def stopped_engine(error: BaseException) -> bool:
    """Whether ``error`` says the engine itself stopped (vLLM's ``EngineDeadError``): nothing more can be spoken."""
    return type(error).__name__ == "EngineDeadError"


def public_error(error: BaseException) -> str:
    """What a client is told of a failure inside the server: its kind and our own message, never a trace; while the
    server drains (:mod:`.lifecycle`), that it shut down before the speech was finished."""
    if isinstance(error, RequestRefused):
        return str(error)
    if LIFECYCLE.draining:
        speech_metrics().failed("shutdown")
        logger.info("speech request ended by the shutdown: %s: %s", type(error).__name__, error)
        return "the server shut down before this speech was finished (--shutdown-timeout): send it again elsewhere"
    speech_metrics().failed("engine" if stopped_engine(error) else "server")
    logger.warning("speech request failed: %s: %s", type(error).__name__, error, exc_info=logger.isEnabledFor(10))
    return f"the server failed while speaking ({type(error).__name__}: see the server log)"
