"""The bodies a speech request answers with: the codec stream (wire protocol) or PCM/WAV decoded here.

Each is an async iterator of bytes that follows the talker: frames leave as the engine makes them.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np


async def codec_stream(edge: Any, plan: Any, request: Any, request_id: str, per_message: int) -> AsyncIterator[bytes]:
    """The wire protocol as an HTTP body: magic, start, frames messages as the talker makes frames, done."""
    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, StreamStart, message_batches, record
    from vllm_omni.edge.stream.encoder import CodecStreamEncoder

    encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=request_id))
    yield RECORDING_MAGIC + record(KIND_JSON, encoder.start())
    try:
        async for frames in edge.generator.stream(request, request_id):
            for piece in message_batches(frames, per_message):
                yield record(KIND_BINARY, encoder.frames(piece))
    except Exception as error:  # the stream says what went wrong; the client keeps the audio so far
        yield record(KIND_JSON, encoder.done(reason="error", error=f"{type(error).__name__}: {error}"))
        return
    empty = np.zeros((0, plan.codec.num_quantizers), dtype=np.int64)
    yield record(KIND_BINARY, encoder.frames(empty, end_of_stream=True))
    yield record(KIND_JSON, encoder.done())


async def pcm_stream(edge: Any, request: Any, request_id: str) -> AsyncIterator[bytes]:
    """s16le PCM decoded on the server with the exact stateful decoder, as frames arrive."""
    from vllm_omni.edge.audio import float_to_pcm16
    from vllm_omni.edge.runtime import open_decoder

    decoder = await asyncio.to_thread(open_decoder, edge.plans.server_decoder, check_sha256=False, prepack=True)
    async for frames in edge.generator.stream(request, request_id):
        audio = await asyncio.to_thread(decoder.feed, frames)
        if audio.size:
            yield float_to_pcm16(audio).tobytes()
    tail = await asyncio.to_thread(decoder.flush)
    if tail.size:
        yield float_to_pcm16(tail).tobytes()


# The data size a streamed WAV header carries: the length is not known when the header leaves.
UNKNOWN_LENGTH = 0xFFFFFFFF - 36


def wav_header(data_bytes: int, sample_rate: int) -> bytes:
    """A 16-bit mono WAV header; ``data_bytes`` :data:`UNKNOWN_LENGTH` marks a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


async def with_wav_header(pcm: AsyncIterator[bytes], sample_rate: int) -> AsyncIterator[bytes]:
    """``pcm`` behind a WAV header of unknown length (a streamed ``response_format: wav``)."""
    yield wav_header(UNKNOWN_LENGTH, sample_rate)
    async for chunk in pcm:
        yield chunk
