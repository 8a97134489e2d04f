"""``/v1/audio/speech/stream``: one WebSocket session of the codec stream, text arriving in pieces."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import numpy as np

from .edge_state import EdgeServingState
from .speech_api import to_speech_request

# WebSocket close codes (4000-4999 are the application's): what went wrong with the client's messages.
CLOSE_BAD_MESSAGE = 4400
CLOSE_NOT_SERVED = 4404
CLOSE_NOT_READY = 4503


class SpeechSocket:
    """One ``/v1/audio/speech/stream`` connection: the codec stream over a WebSocket, text in pieces.

    Client -> server (JSON text messages): ``{"type": "start", ...}`` with the fields of
    ``POST /v1/audio/speech`` (``edge_hardware`` required, ``input`` optional); then any number of
    ``{"type": "text", "text": ...}`` (a piece that is empty or whitespace is accepted and says nothing);
    then ``{"type": "end"}``, or ``{"type": "cancel"}`` at any time.
    Each text piece is one segment, generated as soon as the ones before it are done: speech starts
    with the first piece while later text is still arriving. Server -> client: the wire protocol's
    start message (text), frames messages (binary; each segment ends with a ``segment end`` flag,
    the stream with ``end of stream``) and done (text: ``complete``, ``cancelled`` or ``error``).
    A malformed message closes the socket with code 4400 and the reason, an unserved class with 4404.
    """

    def __init__(self, edge: EdgeServingState | None, socket: Any, speech_body: Any) -> None:
        self.edge, self.socket, self.speech_body = edge, socket, speech_body
        self.pieces: asyncio.Queue = asyncio.Queue()

    async def close(self, code: int, reason: str) -> None:
        await self.socket.close(code=code, reason=reason[:120])

    async def receive_json(self) -> dict | None:
        """The next client message as a dict, or None after closing the socket on a malformed one."""
        message = await self.socket.receive()
        if message["type"] == "websocket.disconnect":
            return {"type": "disconnect"}
        text = message.get("text")
        try:
            payload = json.loads(text) if text is not None else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            await self.close(CLOSE_BAD_MESSAGE, "expected a JSON text message with a string 'type'")
            return None
        return payload

    async def run(self) -> None:
        from pydantic import ValidationError

        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

        if self.edge is None:
            await self.close(CLOSE_NOT_READY, "the edge routes are not initialised (start the server with --omni)")
            return
        start = await self.receive_json()
        if start is None or start["type"] == "disconnect":
            return
        if start["type"] != "start":
            await self.close(CLOSE_BAD_MESSAGE, f"the first message must be type 'start', got {start['type']!r}")
            return
        fields = {k: v for k, v in start.items() if k != "type"}
        try:
            body = self.speech_body.model_validate({"input": "", **fields, "response_format": "codec"})
        except ValidationError as error:
            first = error.errors()[0]
            await self.close(CLOSE_BAD_MESSAGE, f"start: {'.'.join(map(str, first['loc']))}: {first['msg']}")
            return
        plan = self.edge.plans.published.get(body.edge_hardware or "")
        if plan is None:
            served = ", ".join(self.edge.plans.published)
            await self.close(CLOSE_NOT_SERVED, f"edge_hardware {body.edge_hardware!r} is not served; served: {served}")
            return
        if body.input:
            await self.pieces.put(body.input)
        try:  # refuse a bad voice/language up front, with a stand-in text when none came yet
            self.edge.generator.build_request(to_speech_request(body.model_copy(update={"input": body.input or "."})))
        except SpeechRequestError as error:
            await self.close(CLOSE_BAD_MESSAGE, str(error))
            return
        speaker = asyncio.create_task(self.speak(body, plan))
        try:
            await self.listen(speaker)
        finally:
            if not speaker.done():
                speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)

    async def listen(self, speaker: asyncio.Task) -> None:
        """Client messages until ``end``: text pieces are queued, ``cancel`` stops the speech now."""
        while not speaker.done():
            receive = asyncio.create_task(self.receive_json())
            done, _ = await asyncio.wait({receive, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                return
            message = receive.result()
            if message is None:
                speaker.cancel()
                return
            kind = message["type"]
            if kind == "text" and isinstance(message.get("text"), str):
                if message["text"].strip():  # a piece of whitespace alone (token streams send them) says nothing
                    await self.pieces.put(message["text"])
            elif kind == "end":
                await self.pieces.put(None)
                await speaker
                return
            elif kind in ("cancel", "disconnect"):
                speaker.cancel()
                if kind == "cancel":
                    await asyncio.gather(speaker, return_exceptions=True)
                    if self.encoder is not None:
                        await self.socket.send_text(self.encoder.done(reason="cancelled").decode())
                    await self.close(1000, "cancelled")
                return
            else:
                speaker.cancel()
                await self.close(CLOSE_BAD_MESSAGE, f"unexpected message type {kind!r} (text, end or cancel)")
                return

    encoder = None  # the stream's CodecStreamEncoder, once the start message is out

    async def speak(self, body, plan) -> None:
        """Segments in order: each text piece through the talker, frames out as they are made."""
        from vllm_omni.edge.stream import StreamStart, message_batches
        from vllm_omni.edge.stream.encoder import CodecStreamEncoder

        encoder = self.encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=f"speech-{uuid.uuid4().hex}"))
        await self.socket.send_text(encoder.start().decode())
        empty = np.zeros((0, plan.codec.num_quantizers), dtype=np.int64)
        try:
            while (text := await self.pieces.get()) is not None:
                request = to_speech_request(body.model_copy(update={"input": text}))
                async for frames in self.edge.generator.stream(request, f"speech-{uuid.uuid4().hex}"):
                    for piece in message_batches(frames, body.frames_per_message):
                        await self.socket.send_bytes(encoder.frames(piece))
                await self.socket.send_bytes(encoder.frames(empty, segment_end=True))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the done message says what went wrong
            await self.socket.send_text(encoder.done(reason="error", error=f"{type(error).__name__}: {error}").decode())
            await self.close(1011, "speech failed")
            return
        await self.socket.send_bytes(encoder.frames(empty, end_of_stream=True))
        await self.socket.send_text(encoder.done().decode())
        await self.close(1000, "complete")
