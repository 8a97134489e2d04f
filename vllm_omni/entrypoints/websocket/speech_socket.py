"""``/v1/audio/speech/stream`` in this project's first vocabulary (``start`` / ``text`` / ``flush`` / ``end`` /
``cancel``): one codec stream per connection, text arriving in pieces. Kept as an alias for the clients written
against it; upstream vLLM-Omni's vocabulary (:mod:`.speech_session`) is the current one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from vllm_omni.errors import RequestRefused

from ..openai.speech_api import SpeechApiError, check_text, speech_body
from ..server.serving_state import ServingState
from ..server.speech_metrics import speech_metrics
from .server_audio import ServerAudio, ServerAudioError
from .socket_session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_NOT_SERVED,
    CLOSE_SEND_S,
    CLOSE_TOO_MUCH_QUEUED,
    SocketClosed,
    SocketSession,
    failure_code,
    refusal_code,
)
from .speech_text import TextSegmenter

# "sentence": each sentence its own talker request and segment; "stream": every piece into one running request.
TEXT_MODES = ("sentence", "stream")
DEFAULT_TEXT_MODE = "sentence"  # today's clients keep what they had; docs/serving/serve.md says why


class SpeechSocket(SocketSession):
    """One ``/v1/audio/speech/stream`` connection: the codec stream over a WebSocket, text in pieces.

    Client -> server (JSON text messages): ``{"type": "start", ...}`` with the fields of
    ``POST /v1/audio/speech`` (``edge_hardware`` required, ``input`` optional); then any number of
    ``{"type": "text", "text": ...}``, ``{"type": "flush"}``; then ``{"type": "end"}``, or
    ``{"type": "cancel"}`` at any time (after ``end`` too). ``{"type": "server_audio", "from_frame": D}`` (once, at
    any time) asks for the stream's audio decoded here from frame ``D`` on, as ``pcm`` text messages beside the
    frames (:mod:`.server_audio`: a device too slow to decode in real time hands over without a gap; with
    ``"server_audio": true`` in the start, the session waits after done for such a request). Text pieces
    are joined as sent, whitespace included. The start's ``text_mode`` says how they are spoken:

    * ``"sentence"`` (default): cut into sentences (:class:`~.speech_text.TextSegmenter`); ``flush`` and
      ``end`` cut what is left. Each sentence is one request and one segment, generated as soon as the ones
      before it are done: speech starts with the first sentence while later text is still arriving.
    * ``"stream"``: every piece into one running request (``stream_text``: each talker step runs once its text
      token is known), one segment; ``flush`` changes nothing; the whole text is bounded by
      ``socket_max_queued_chars``; frames held for a full message leave as soon as the talker waits for text.

    Server -> client: the wire
    protocol's start message (text; its ``limits`` announce this server's :class:`~vllm_omni.edge.stream.SessionLimits`,
    which clients split their text by), frames messages (binary; the first frame of a segment alone, then
    ``frames_per_message`` at a time; each segment ends with a ``segment end`` flag, the stream with
    ``end of stream``) and done (text: ``complete``, ``cancelled`` or ``error`` with the whole message).

    Limits (:class:`~..openai.speech_limits.SpeechLimits`): a message over ``max_body_bytes`` closes with 1009, a
    piece over ``max_input_chars``, sentences queued past ``socket_max_queued_utterances`` or text queued past
    ``socket_max_queued_chars`` (sent, not yet being spoken) with 4413, a session idle for ``socket_idle_s``
    (nothing to speak, no message; in stream mode before ``end``: no message and no frame sent) or older than
    ``socket_max_s`` with 4408. A malformed message closes with 4400, an unserved class with 4404.
    One task owns the session (reads, checks, closes); the speaker task only sends frames.
    """

    IDLE_HINT = "send text, flush, end or cancel"

    def __init__(self, serving: ServingState, socket: Any, speech_model: Any) -> None:
        super().__init__(serving, socket, speech_model)
        self.segments: asyncio.Queue[str | None] = asyncio.Queue()
        self.speaking = False
        self.ended = False  # the client sent `end`: speak what is queued, then close
        self.encoder = None  # the stream's CodecStreamEncoder, once the start message is out
        self.text_mode = DEFAULT_TEXT_MODE
        self.pieces: asyncio.Queue[str | None] = asyncio.Queue()  # stream mode: the client's text, then None
        self.streamed_chars = 0
        self.last_sent = 0.0  # when the last frames message left
        self.last_text = time.monotonic()  # when the last text piece came (stream mode's only sign of life)
        self.segmenter: TextSegmenter | None = None  # sentence mode: the text cut into sentences
        self.stream_meter = self.speech.meter("websocket", "stream")  # stream mode: the one utterance's
        self.server_audio = ServerAudio(self.speech, self.send_text)  # the frames sent; their PCM once asked for
        self.await_server_audio = False  # the start's "server_audio": the session stays open after done for it
        self.awaiting_late_audio = False  # done is sent and the session waits for that request

    async def last_words(self, code: int, message: str) -> None:
        """A stream that started hears the whole message in its done."""
        if self.encoder is not None and code != 1000:
            await self.socket.send_text(self.encoder.done(reason="error", error=message).decode())

    async def run(self, start: dict) -> None:
        """The session that ``start`` (its first message, type ``start``) opens."""
        with contextlib.suppress(SocketClosed):
            await self._run(start)

    async def _run(self, start: dict) -> None:
        limits = self.speech.limits
        fields = {k: v for k, v in start.items() if k not in ("type", "text_mode", "server_audio")}
        self.text_mode = start.get("text_mode", DEFAULT_TEXT_MODE)
        self.await_server_audio = start.get("server_audio", False)
        if type(self.await_server_audio) is not bool:
            await self.close(
                CLOSE_BAD_MESSAGE, f"start: server_audio must be true or false, got {self.await_server_audio!r}"
            )
        if self.text_mode not in TEXT_MODES:
            await self.close(
                CLOSE_BAD_MESSAGE, f"start: text_mode must be one of {', '.join(TEXT_MODES)}, got {self.text_mode!r}"
            )
        if self.text_mode == "stream" and fields.get("non_streaming_mode"):
            await self.close(
                CLOSE_BAD_MESSAGE,
                "start: text_mode 'stream' speaks in the streamed-text layout: drop non_streaming_mode "
                "(or use text_mode 'sentence')",
            )
        try:
            data = {"input": "", **fields, "response_format": "codec"}
            body = speech_body(self.speech_model, data, limits, self.speech.served_models, self.speech.config)
        except SpeechApiError as error:
            await self.close(CLOSE_BAD_MESSAGE, f"start: {str(error).removeprefix('invalid ')}")
        try:
            plan = self.plans.plan(body.edge_hardware)
        except RequestRefused as error:
            await self.close(CLOSE_NOT_SERVED, f"start: {error}")
        try:  # the voice made once (a cloned one encoded), and refused up front if the checkpoint cannot speak it
            template = await self.voice_template(body)
        except SpeechApiError as error:
            await self.close(CLOSE_BAD_MESSAGE, f"start: {error}")
        except RequestRefused as error:
            await self.close(refusal_code(error), str(error))
        segmenter = self.segmenter = TextSegmenter(limits.max_input_chars)
        if body.input and self.text_mode == "stream":
            await self.queue_piece(body.input)
        elif body.input:
            await self.queue([*segmenter.add(body.input), segmenter.flush()])
        self.last_text = time.monotonic()  # the idle clock starts with the session, not before its voice was made
        await self.serve(self.speak(body, template, plan))

    async def queue(self, segments: list[str | None]) -> None:
        """Sentence mode: each sentence queued as an utterance of its own, within the session's bounds
        (:class:`.socket_session.UtteranceQueue`, as upstream's vocabulary)."""
        for segment in segments:
            if segment is None:
                continue
            await self.within_bounds(self.queued.admit, len(segment))
            self.segments.put_nowait(segment)

    async def queue_piece(self, text: str) -> None:
        """Stream mode: a piece of the one utterance; its whole text is bounded by ``socket_max_queued_chars``."""
        if not self.streamed_chars:  # the utterance's first text: its first frame and audio are measured from here
            self.stream_meter.restart()
        self.streamed_chars += len(text)
        await self.within_bounds(self.queued.check_streamed, self.streamed_chars, "end it and start another session")
        self.pieces.put_nowait(text)

    async def text_pieces(self) -> AsyncIterator[str]:
        """Stream mode: the client's pieces as they come, until ``end``."""
        while (piece := await self.pieces.get()) is not None:
            yield piece

    def idle_closes(self) -> bool:
        """Stream mode: idle is idle (a talker waiting for text); sentence mode: only with nothing to speak; never
        while done is out and a late ``server_audio`` may come (that wait has its own bound)."""
        if self.awaiting_late_audio:
            return False
        return self.text_mode == "stream" or (not self.speaking and self.segments.empty())

    def last_activity(self, last_message: float) -> float:
        """When the session last showed life: a client message; in stream mode (before ``end``) a text piece or frames
        sent, never a ``flush`` (which changes nothing there). A streamed utterance whose talker waits for text
        that does not come is idle; after ``end`` it only speaks."""
        if self.text_mode != "stream":
            return last_message
        if self.ended:
            return time.monotonic()
        return max(self.last_text, self.last_sent)

    async def handle(self, message: dict) -> bool:
        """One client message; True when the session is over."""
        speaker, segmenter = self.speaker, self.segmenter
        kind = message["type"]
        if kind in ("cancel", "disconnect"):
            speaker.cancel()
            if kind == "cancel":
                await asyncio.gather(speaker, return_exceptions=True)
                if self.encoder is not None:
                    with contextlib.suppress(Exception):
                        done = self.encoder.done(reason="cancelled").decode()
                        await asyncio.wait_for(self.socket.send_text(done), CLOSE_SEND_S)
                await self.close(1000, "cancelled")
            return True
        if self.ended and kind in ("text", "flush", "end"):
            await self.close(CLOSE_BAD_MESSAGE, f"a {kind!r} message after 'end' (only 'cancel' may follow it)")
        if kind == "text":
            text = message.get("text")
            if not isinstance(text, str):
                await self.close(CLOSE_BAD_MESSAGE, f"a text message needs a string 'text', got {type(text).__name__}")
            limit = self.speech.limits.max_input_chars
            try:
                check_text("text", text, limit, "speech-max-input-chars")
            except SpeechApiError as error:
                await self.close(CLOSE_TOO_MUCH_QUEUED if len(text) > limit else CLOSE_BAD_MESSAGE, str(error))
            if self.text_mode == "stream":
                self.last_text = time.monotonic()
                await self.queue_piece(text)
            else:
                await self.queue(segmenter.add(text))
            return False
        if kind == "flush":  # stream mode: every word is spoken once the next piece shows where it ends
            if self.text_mode != "stream":
                await self.queue([segmenter.flush()])
            return False
        if kind == "server_audio":
            from ..server.speech_streams import public_error

            try:
                await self.server_audio.start(message.get("from_frame"))
                speech_metrics().handovers.inc()
            except ServerAudioError as error:
                await self.close(CLOSE_BAD_MESSAGE, str(error))
            except (asyncio.CancelledError, SocketClosed):
                raise
            except Exception as error:  # the server's decoder failed: the client hears why
                await self.close(failure_code(), public_error(error))
            return False
        if kind == "end":
            if self.text_mode == "stream":
                self.pieces.put_nowait(None)
            else:
                await self.queue([segmenter.flush()])
                self.segments.put_nowait(None)
            self.ended = True
            return False
        await self.close(
            CLOSE_BAD_MESSAGE, f"unexpected message type {kind!r} (text, flush, end, cancel or server_audio)"
        )

    async def start_stream(self, plan) -> Any:
        """The wire protocol's start message, sent, with this server's limits (``limits``: the client splits its
        text by them, whatever this server was started with); the stream's encoder."""
        from vllm_omni.edge.stream import SessionLimits, StreamStart
        from vllm_omni.edge.stream.encoder import CodecStreamEncoder

        limits = self.speech.limits
        announced = SessionLimits(**{f.name: getattr(limits, f.name) for f in dataclasses.fields(SessionLimits)})
        start = StreamStart.for_plan(plan, stream_id=f"speech-{uuid.uuid4().hex}", limits=announced.to_json())
        encoder = CodecStreamEncoder(start)
        await self.send_text(encoder.start().decode())
        self.encoder = encoder
        return encoder

    async def finish_stream(self, encoder: Any, plan: Any) -> NoReturn:
        """End of stream, done, close 1000."""
        from ..server.speech_streams import public_error

        end, done = encoder.finish()
        try:  # the end of stream flushes the decoder: its last PCM before done
            await self.server_audio.segment_end()
        except (asyncio.CancelledError, SocketClosed):
            raise
        except Exception as error:
            await self.close(failure_code(), public_error(error))
        await self.send_bytes(end)
        await self.send_text(done.decode())
        self.encoder = None
        if self.await_server_audio:  # a late request's PCM follows done; a client that needs none closes first
            self.awaiting_late_audio = True  # not idle: this wait is the bound
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.server_audio.caught_up.wait(), self.speech.limits.socket_idle_s)
        async with self.server_audio.lock:  # a request that crossed done is answered whole before the close
            await self.close(1000, "complete")

    async def speak(self, body, template, plan) -> None:
        """The codec stream of the session: start, the frames of its text (:meth:`speak_sentences` or
        :meth:`speak_streamed`), end of stream, done; a request error closes with its message."""
        from ..server.speech_streams import public_error

        encoder = await self.start_stream(plan)
        try:
            if self.text_mode == "stream":
                await self.speak_streamed(encoder, body, template)
            else:
                await self.speak_sentences(encoder, body, template, plan)
        except (asyncio.CancelledError, SocketClosed):
            raise
        except RequestRefused as error:  # text the checkpoint cannot speak (too long, empty), or a full queue
            await self.close(refusal_code(error), str(error))
        except Exception as error:  # the done message says what went wrong
            await self.close(failure_code(), public_error(error))
        await self.finish_stream(encoder, plan)

    async def speak_sentences(self, encoder, body, template, plan) -> None:
        """Sentence mode: each sentence through the talker as its own request, each a segment."""
        from ..server.speech_streams import frame_batches

        while (text := await self.segments.get()) is not None:
            self.speaking = True
            self.queued.taken(len(text))
            request_id = f"speech-{uuid.uuid4().hex}"
            meter = self.speech.meter("websocket", "sentence")  # from when the speaker took the sentence
            prepared = await self.speech.prepare(dataclasses.replace(template, text=text), request_id)
            frames = meter.frames(self.speech.generator.stream_prepared(prepared, request_id))
            async with contextlib.aclosing(frame_batches(frames, body.frames_per_message)) as batches:
                async for piece in batches:
                    await self.server_audio.frames(piece)
                    await self.send_bytes(encoder.frames(piece))
                    meter.sent(len(piece))
            await self.server_audio.segment_end()
            await self.send_bytes(encoder.marker(segment_end=True))
            self.speaking = False

    async def speak_streamed(self, encoder, body, template) -> None:
        """Stream mode: every piece into one talker request (``stream_text``), frames out as they are made: one
        segment, no flush of the device's decoder in the middle."""
        from ..server.speech_streams import frame_batches

        self.speaking = True
        request_id = f"speech-{uuid.uuid4().hex}"
        request = dataclasses.replace(template, text=None)
        frames = self.speech.generator.stream_text(
            request, self.text_pieces(), request_id, text_timeout_s=self.text_timeout_s
        )
        meter = self.stream_meter
        async with contextlib.aclosing(frame_batches(meter.frames(frames), body.frames_per_message)) as batches:
            async for piece in batches:
                await self.server_audio.frames(piece)
                await self.send_bytes(encoder.frames(piece))
                meter.sent(len(piece))
                self.last_sent = time.monotonic()
