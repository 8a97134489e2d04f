"""``/v1/audio/speech/stream`` in upstream vLLM-Omni's vocabulary, the current one, with this project's
capabilities as extensions inside it.

Client -> server (JSON text messages):

* ``{"type": "session.config", ...}``: first, and again between utterances (refused, the session going on, while
  text is buffered); the fields of ``POST /v1/audio/speech`` (``voice`` or ``speaker``, ``task_type``,
  ``language``, ``instructions``, ``response_format`` (default ``wav``, upstream's), ``speed``,
  ``max_new_tokens``, ``initial_codec_chunk_frames``, the voice-cloning fields, the generator's), upstream's
  ``stream_audio`` (audio sent as it is decoded instead of one whole file), and ours: ``"text_mode": "stream"``
  (each ``input.text`` goes straight into one running talker request, speaking before ``input.done``; exact,
  frames equal to the whole text's) and ``"edge_hardware": CLASS`` (the codec stream of that class's plan, for a
  device to decode, instead of audio).
* ``{"type": "input.text", "text": ...}``: text, joined as sent (whitespace pieces included).
* ``{"type": "input.done"}``: the text so far is one utterance (buffered mode: spoken as one request; stream
  mode: the running request's text ends). The connection stays open for the next.
* ``{"type": "session.close"}``: what is queued is spoken, then the connection closes with 1000.

Server -> client, per utterance (``utterance_index`` counts ``input.done`` from 0; ``sentence_index`` is always 0,
the utterance is not cut): ``audio.start`` ``{utterance_index, sentence_index, sentence_text, format,
sample_rate}``; the audio as binary messages (``stream_audio``: chunks as decoded, else one whole file; with
``edge_hardware``: the codec stream's own messages, start and done as text, frames as binary); ``audio.done``
``{utterance_index, sentence_index, total_bytes, error, frames}``; then ``session.done`` ``{utterance_index,
total_sentences}``. ``{"type": "error", "message"}`` reports a refused message (the session goes on) or a failed
utterance (then ``audio.done`` has ``error: true``). A first message that is not a ``session.config`` (another
type, a field of the wrong type) ends the session with close 4400, an unserved ``edge_hardware`` with 4404; a first
``session.config`` this checkpoint cannot speak (an unknown voice, ``word_timestamps``, a reference it cannot fetch)
is said in an ``error`` at once and again at each ``input.done`` (then ``session.done``, no audio), as upstream
does, and the session stays open for a ``session.config`` it can speak. The limits of :mod:`.socket_session`
hold: a message over ``--speech-max-body-bytes`` closes with 1009; buffered text is bounded by
``--speech-max-input-chars`` (an ``input.text`` past it is refused, the session going on), a streamed utterance's
text by ``--speech-socket-max-queued-chars`` (close 4413: a request cannot lose text in its middle), and the
utterances waiting to be spoken by ``--speech-socket-max-queued-utterances`` and their text by
``--speech-socket-max-queued-chars`` (close 4413, the first vocabulary's refusal word for word); no message and
nothing to speak for ``--speech-socket-idle-s`` (in stream mode: no text) closes with 4408, as does a session past
``--speech-socket-max-s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_omni.errors import RequestRefused

from ..generation.stream_report import FLUSH, StreamReport
from ..openai.speech_api import BodyShapeError, SpeechApiError, check_text, speech_body
from ..server.lifecycle import LIFECYCLE
from ..server.serving_state import ServingState
from ..server.speech_metrics import Meter, speech_metrics
from .socket_session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_GOING_AWAY,
    CLOSE_NOT_SERVED,
    SocketClosed,
    SocketSession,
    failure_code,
)

SESSION_DEFAULT_FORMAT = "wav"  # upstream's default on its WebSocket


class UtteranceFailed(Exception):
    """An utterance that failed after its stream said so; the message is what the client is told, and
    ``engine_stopped`` whether the engine itself stopped (nothing more can be spoken)."""

    def __init__(self, message: str, engine_stopped: bool = False) -> None:
        super().__init__(message)
        self.engine_stopped = engine_stopped


def session_config_model(speech_model: Any) -> Any:
    """The typed ``session.config`` message: the speech body's fields, ``input`` optional, and the session's own."""
    from typing import Literal

    from pydantic import create_model

    return create_model(
        "SessionConfig",
        __base__=speech_model,
        input=(str, ""),
        stream_audio=(bool, False),
        text_mode=(Literal["buffered", "stream"], "buffered"),
        alignment=(bool, False),
    )


@dataclass
class SessionSettings:
    """A valid ``session.config``: the body, the voice resolved once, and the plan of its ``edge_hardware``."""

    config: Any
    template: Any
    plan: Any = None
    refusal: str | None = None  # a first session.config this checkpoint cannot speak: why, said per utterance

    @property
    def streams_text(self) -> bool:
        return self.config is not None and self.config.text_mode == "stream"


@dataclass
class Utterance:
    """One ``input.done``'s text, spoken with the session's settings when it was made: whole (``text``), or
    arriving (``pieces``, stream mode; ``None`` ends it)."""

    index: int
    settings: SessionSettings
    text: str = ""
    pieces: asyncio.Queue[str | None] | None = None
    streamed_chars: int = 0
    first_piece: str = ""
    total_bytes: int = 0
    frames: int = 0  # frames sent
    report: StreamReport | None = None  # stream mode: what each frame had read, how it ended
    speaking: asyncio.Task | None = None
    cancelled: bool = False
    ending: str | None = None  # once audio.done is sent
    meter: Meter | None = None  # its first frame and audio, measured from when it was queued

    def text_offset(self) -> int | None:
        """The characters of the text the frames sent had read (stream mode; None otherwise)."""
        if self.report is None:
            return None
        return self.report.frame_chars[self.frames - 1] if self.frames else 0

    @property
    def empty(self) -> bool:
        return self.pieces is None and not self.text


async def open_session(serving: ServingState, socket: Any, speech_model: Any) -> None:
    """The session the connection's first message opens: upstream's vocabulary (``session.config``), or this
    project's first one (``start``, :class:`~.speech_socket.SpeechSocket`)."""
    from .speech_socket import SpeechSocket

    session = SpeechSession(serving, socket, speech_model)
    with contextlib.suppress(SocketClosed):
        first = await session.receive(serving.speech.limits.socket_idle_s, "session.config")
        if first["type"] == "disconnect":
            return
        if first["type"] == "start":
            with speech_metrics().sessions_open.labels("first").track_inprogress():
                await SpeechSocket(serving, socket, speech_model).run(first)
            return
        with speech_metrics().sessions_open.labels("upstream").track_inprogress():
            await session.run(first)


class SpeechSession(SocketSession):
    """One connection in upstream's vocabulary (module docstring). The listening task owns the session (reads,
    checks, closes); the speaker task speaks the queued utterances in order and sends their messages."""

    IDLE_HINT = "send input.text, input.done or session.close"

    def __init__(self, serving: ServingState, socket: Any, speech_model: Any) -> None:
        super().__init__(serving, socket, speech_model)
        self.config_model = session_config_model(speech_model)
        self.settings: SessionSettings | None = None
        self.buffer: list[str] = []
        self.buffered_chars = 0
        self.utterances: asyncio.Queue[Utterance | None] = asyncio.Queue()
        self.unfinished = 0  # utterances queued or being spoken
        self.streaming: Utterance | None = None  # stream mode: the utterance whose text is arriving
        self.next_index = 0
        self.closing = False
        self.going_away = False  # the server drains: the session ends once its queue is spoken (close 1001)
        self.last_text = time.monotonic()
        self.current: Utterance | None = None  # the utterance being spoken

    async def last_words(self, code: int, message: str) -> None:
        if code not in (1000, CLOSE_GOING_AWAY):  # going away: the error, if any, was said already
            await self.socket.send_text(_json({"type": "error", "message": message}))

    async def error(self, message: str) -> None:
        """A refused message or a failed utterance; the session goes on."""
        await self.send_text(_json({"type": "error", "message": message}))

    async def run(self, first: dict) -> None:
        with contextlib.suppress(SocketClosed):
            if first["type"] != "session.config":
                await self.close(
                    CLOSE_BAD_MESSAGE, f"the first message must be session.config (or start), got {first['type']!r}"
                )
            try:
                self.settings = await self.configure(first)
            except BodyShapeError as error:  # not a session.config at all
                await self.close(CLOSE_BAD_MESSAGE, str(error))
            except RequestRefused as error:
                if error.status == 404:  # an unserved edge_hardware: this session has nothing to send
                    await self.close(CLOSE_NOT_SERVED, str(error))
                # What this checkpoint cannot speak is said now and at each input.done, and the session stays open,
                # as upstream's (its clients read errors per utterance, then session.done).
                self.settings = SessionSettings(None, None, refusal=str(error))
                await self.error(str(error))
            await self.serve(self.speak_all())
            if not self.speaker.cancelled() and self.speaker.exception() is None:  # session.close: all spoken
                if self.going_away:
                    await self.close(CLOSE_GOING_AWAY, "the server is shutting down: the session's speech was sent")
                await self.close(1000, "session closed")

    async def configure(self, message: dict) -> SessionSettings:
        """A ``session.config`` checked and its voice resolved; :class:`SpeechApiError` otherwise (a
        :class:`BodyShapeError` for one that is not a session.config, 404 for an unserved class)."""
        speech = self.speech
        fields = {key: value for key, value in message.items() if key != "type"}
        if fields.get("edge_hardware") is not None and fields.setdefault("response_format", "codec") != "codec":
            raise SpeechApiError(400, "session.config: edge_hardware sends codec frames; drop response_format")
        fields.setdefault("response_format", SESSION_DEFAULT_FORMAT)
        if fields["response_format"] == "codec" and fields.get("edge_hardware") is None:
            raise SpeechApiError(400, "session.config: response_format codec needs edge_hardware")
        try:
            config = speech_body(self.config_model, fields, speech.limits, speech.served_models, speech.config)
        except SpeechApiError as error:  # a BodyShapeError stays one
            message = f"session.config: {str(error).removeprefix('invalid ')}"
            raise type(error)(error.status, message) from None
        if config.text_mode == "stream" and config.non_streaming_mode:
            raise SpeechApiError(
                400, "session.config: text_mode 'stream' speaks in the streamed-text layout: drop non_streaming_mode"
            )
        try:
            plan = self.plans.plan(config.edge_hardware) if config.edge_hardware is not None else None
            template = await self.voice_template(config)
        except RequestRefused as error:
            raise SpeechApiError(error.status, f"session.config: {error}") from None
        return SessionSettings(config, template, plan)

    # -- listening ---------------------------------------------------------------------------------------------

    def idle_closes(self) -> bool:
        """Idle with nothing to speak, or while a streamed utterance waits for text."""
        return self.streaming is not None or not self.unfinished

    def last_activity(self, last_message: float) -> float:
        """A client message; in stream mode, while an utterance's text is arriving, text only (any other message
        does not keep a paused request alive)."""
        return self.last_text if self.streaming is not None else last_message

    async def handle(self, message: dict) -> bool:
        kind = message["type"]
        if kind == "disconnect":
            return True
        if self.closing:  # after session.close the session only speaks what is queued
            return False
        if kind == "session.config":
            if self.buffer or self.streaming is not None:
                await self.error("session.config cannot be applied while input is buffered; send input.done first")
                return False
            try:
                self.settings = await self.configure(message)
            except SpeechApiError as error:
                await self.error(f"{error} (the session keeps its configuration)")
        elif kind == "input.text":
            await self.take_text(message.get("text", ""))
        elif kind == "input.done" and LIFECYCLE.draining:  # what is queued is spoken; nothing new
            if self.streaming is not None:  # an utterance being spoken: its text ends here
                await self.end_utterance()
            else:
                await self.error("input.done not spoken: the server is shutting down; send it to another server")
            self.closing = self.going_away = True
            self.utterances.put_nowait(None)
        elif kind == "input.done":
            await self.end_utterance()
        elif kind == "input.cancel":
            self.cancel_utterance()
        elif kind == "input.flush":
            await self.flush_text()
        elif kind == "session.close":
            await self.end_utterance(only_open=True)
            self.closing = True
            self.utterances.put_nowait(None)
        else:
            await self.error(
                f"unknown message type {kind!r} (session.config, input.text, input.flush, input.done, input.cancel, "
                "session.close)"
            )
        return False

    async def take_text(self, text: Any) -> None:
        limits = self.speech.limits
        if not isinstance(text, str):
            await self.error(f"input.text requires a string text, got {type(text).__name__}")
            return
        self.last_text = time.monotonic()
        try:
            check_text("text", text, limits.max_input_chars, "speech-max-input-chars")
        except SpeechApiError as error:
            await self.error(f"input.text refused: {error}")
            return
        if self.settings.streams_text:
            utterance = self.streaming or await self.begin_streamed()
            ended = utterance.ending or (utterance.report.ending if utterance.report is not None else None)
            if ended is not None:  # spoken already: the talker ended before its text did
                await self.error(
                    f"input.text not spoken: utterance {utterance.index} ended ({ended}) before its text "
                    "did; send input.done, then the next utterance's text"
                )
                return
            utterance.streamed_chars += len(text)
            await self.within_bounds(self.queued.check_streamed, utterance.streamed_chars, "send input.done sooner")
            utterance.first_piece = utterance.first_piece or text
            utterance.pieces.put_nowait(text)
            return
        if self.buffered_chars + len(text) > limits.max_input_chars:
            await self.error(
                f"input.text refused: the utterance would be {self.buffered_chars + len(text)} characters; one "
                f"takes at most {limits.max_input_chars} (--speech-max-input-chars): send input.done first"
            )
            return
        self.buffer.append(text)
        self.buffered_chars += len(text)

    async def begin_streamed(self) -> Utterance:
        utterance = Utterance(self.next_index, self.settings)
        utterance.pieces = asyncio.Queue()
        await self.enqueue(utterance)
        self.streaming = utterance
        return utterance

    async def end_utterance(self, only_open: bool = False) -> None:
        """``input.done``: the buffered text as one utterance, or the streamed one's text ended (``only_open``:
        only that, as ``session.close`` does)."""
        if self.streaming is not None:
            self.streaming.pieces.put_nowait(None)
            self.streaming = None
            return
        text = "".join(self.buffer).strip()
        self.buffer, self.buffered_chars = [], 0
        if only_open and not text:
            return
        await self.enqueue(Utterance(self.next_index, self.settings, text=text))

    async def flush_text(self) -> None:
        """``input.flush`` (stream mode, opt-in): the streamed utterance's pending word is committed now instead of
        waiting for the text after it; from there on its tokens need not equal the whole text's."""
        if not self.settings.streams_text:
            await self.error(
                "input.flush commits the pending word of a streamed utterance: it needs text_mode stream (in "
                "buffered mode, input.done speaks the text)"
            )
        elif self.streaming is not None:
            self.streaming.pieces.put_nowait(FLUSH)

    def cancel_utterance(self) -> None:
        """``input.cancel`` (barge-in): the utterance being spoken, or whose text is arriving, stops now; its
        ``audio.done`` says ``ending: cancelled`` with the frames sent and the text they had read. Utterances queued
        behind it are spoken as usual; the session stays open."""
        target = self.current if self.current is not None else self.streaming
        if target is None or (target.speaking is not None and target.speaking.done()):  # nothing left to stop
            return
        target.cancelled = True
        if target is self.streaming:  # its text ends here
            self.streaming.pieces.put_nowait(None)
            self.streaming = None
        if target.speaking is not None:
            target.speaking.cancel()

    async def enqueue(self, utterance: Utterance) -> None:
        """``utterance`` queued behind the others, within the session's bounds (:class:`.socket_session.UtteranceQueue`:
        past them the session closes with 4413, as the first vocabulary's does)."""
        await self.within_bounds(self.queued.admit, len(utterance.text))
        config = utterance.settings.config
        whole = config is not None and not config.stream_audio and utterance.settings.plan is None
        utterance.meter = self.speech.meter("websocket", "whole" if utterance.pieces is None else "stream", whole)
        self.next_index += 1
        self.unfinished += 1
        self.utterances.put_nowait(utterance)

    # -- speaking ----------------------------------------------------------------------------------------------

    async def speak_all(self) -> None:
        """The queued utterances in order, each followed by ``session.done``; returns at ``session.close``."""
        while (utterance := await self.utterances.get()) is not None:
            self.queued.taken(len(utterance.text))
            try:
                if utterance.empty:
                    pass
                elif utterance.settings.refusal is not None:  # upstream: an error, then session.done
                    await self.error(f"utterance {utterance.index} not spoken: {utterance.settings.refusal}")
                else:
                    await self.speak_framed(utterance)
                sentences = 0 if utterance.empty else 1
                done = {"type": "session.done", "utterance_index": utterance.index, "total_sentences": sentences}
                await self.send_text(_json(done))
            finally:
                self.unfinished -= 1

    async def speak_framed(self, utterance: Utterance) -> None:
        """``audio.start``, the utterance's audio, ``audio.done``; a failure is said in an ``error`` before it."""
        from ..server.speech_streams import public_error, stopped_engine

        failure, engine_stopped = None, False
        self.current = utterance  # from audio.start on, input.cancel stops it
        try:
            await self.send_text(_json(self.audio_start(utterance)))
            if not utterance.cancelled:
                utterance.speaking = asyncio.create_task(self.speak(utterance))
                await utterance.speaking
        except asyncio.CancelledError:
            if not utterance.cancelled or asyncio.current_task().cancelling():  # the session's, not input.cancel's
                raise
        except SocketClosed:
            raise
        except (RequestRefused, UtteranceFailed) as error:  # said already, or the client's to fix
            failure = str(error)
            engine_stopped = getattr(error, "engine_stopped", False)
        except Exception as error:
            failure = public_error(error)
            engine_stopped = stopped_engine(error)
        finally:
            self.current = None
        if failure is not None:
            await self.error(f"utterance {utterance.index} failed: {failure}")
        await self.send_text(_json(self.audio_done(utterance, failure)))
        if failure is not None and (engine_stopped or LIFECYCLE.draining):  # no later utterance can be spoken
            await self.close(failure_code(), failure)

    def audio_done(self, utterance: Utterance, failure: str | None) -> dict[str, Any]:
        """``audio.done``; ``ending`` says how the utterance ended (``complete``; stream mode: ``eos`` when the
        talker ended before its text did, ``max_frames``; ``failed``, ``cancelled``), and in stream mode
        ``text_offset`` / ``text_chars`` how much of the text its frames had read of all that arrived."""
        done = {"type": "audio.done", "utterance_index": utterance.index, "sentence_index": 0}
        done |= {"total_bytes": utterance.total_bytes, "error": failure is not None, "frames": utterance.frames}
        report = utterance.report
        if utterance.cancelled:
            ending = "cancelled"
        elif failure is not None:
            ending = "failed"
        else:
            ending = report.ending if report is not None and report.ending is not None else "complete"
        done["ending"] = utterance.ending = ending
        if report is not None:
            done |= {"text_offset": utterance.text_offset(), "text_chars": report.text_chars}
        return done

    async def progress(self, utterance: Utterance) -> None:
        """``alignment``: after each audio message of a streamed utterance, the frames sent so far and the
        characters of the text they had read (what was sent to the talker, not an acoustic alignment)."""
        if utterance.settings.config.alignment and utterance.report is not None:
            message = {"type": "audio.progress", "utterance_index": utterance.index, "frames": utterance.frames}
            await self.send_text(_json(message | {"text_offset": utterance.text_offset()}))

    def audio_start(self, utterance: Utterance) -> dict[str, Any]:
        config = utterance.settings.config
        return {
            "type": "audio.start",
            "utterance_index": utterance.index,
            "sentence_index": 0,
            "sentence_text": utterance.text or utterance.first_piece,
            "format": config.response_format,
            "sample_rate": self.speech.sample_rate,
        }

    def frames_of(self, utterance: Utterance) -> AsyncIterator[np.ndarray]:
        """The talker's frames of ``utterance``, as the engine makes them."""
        request_id = f"speech-{uuid.uuid4().hex}"
        generator = self.speech.generator
        if utterance.pieces is None:
            return utterance.meter.frames(self._whole(utterance, request_id))
        request = dataclasses.replace(utterance.settings.template, text=None)
        utterance.report = StreamReport()
        frames = generator.stream_text(
            request, _pieces(utterance.pieces), request_id, text_timeout_s=self.text_timeout_s, report=utterance.report
        )
        return utterance.meter.frames(frames)

    async def _whole(self, utterance: Utterance, request_id: str) -> AsyncIterator[np.ndarray]:
        prepared = await self.speech.prepare(
            dataclasses.replace(utterance.settings.template, text=utterance.text), request_id
        )
        async with contextlib.aclosing(self.speech.generator.stream_prepared(prepared, request_id)) as frames:
            async for new in frames:
                yield new

    async def speak(self, utterance: Utterance) -> None:
        from ..server.speech_streams import decoded_audio, frame_batches, whole_file

        config = utterance.settings.config
        frames = frame_batches(self.frames_of(utterance), config.frames_per_message, config.first_frames)
        if utterance.settings.plan is not None:
            await self.speak_codec(utterance, frames)
            return
        counts: dict[str, int] = {}
        fmt = config.response_format
        chunks = []
        async with contextlib.aclosing(decoded_audio(self.speech, frames, fmt, config.speed, counts)) as audio:
            async for chunk in audio:
                if config.stream_audio:  # the frames sent so far (a whole file sends them all at its end)
                    new_frames, utterance.frames = counts["frames"] - utterance.frames, counts["frames"]
                    await self.send_bytes(chunk)
                    utterance.meter.sent(new_frames)
                    utterance.total_bytes += len(chunk)
                    await self.progress(utterance)
                else:
                    chunks.append(chunk)
        utterance.frames = counts["frames"]
        if not config.stream_audio:
            sample_rate = self.speech.sample_rate
            data = whole_file(b"".join(chunks), fmt, sample_rate)
            await self.send_bytes(data)
            utterance.meter.sent(utterance.frames)
            utterance.meter.delivered()
            utterance.total_bytes = len(data)

    async def speak_codec(self, utterance: Utterance, frames: AsyncIterator[np.ndarray]) -> None:
        """The utterance as one codec stream of its plan: start (text), frames (binary), end of stream, done."""
        from vllm_omni.edge.stream import StreamStart
        from vllm_omni.edge.stream.encoder import CodecStreamEncoder

        plan = utterance.settings.plan
        encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=f"speech-{uuid.uuid4().hex}"))
        await self.send_text(encoder.start().decode())
        try:
            async with contextlib.aclosing(frames) as batches:
                async for batch in batches:
                    data = encoder.frames(batch)
                    await self.send_bytes(data)
                    utterance.meter.sent(len(batch))
                    utterance.total_bytes += len(data)
                    utterance.frames += len(batch)
                    await self.progress(utterance)
        except asyncio.CancelledError:
            if utterance.cancelled and not asyncio.current_task().cancelling():  # input.cancel: the stream says so
                with contextlib.suppress(SocketClosed):
                    await self.send_text(encoder.done(reason="cancelled").decode())
            raise
        except SocketClosed:
            raise
        except Exception as error:  # the codec stream ends with its own word on it; audio.done follows
            from ..server.speech_streams import public_error, stopped_engine

            message = str(error) if isinstance(error, RequestRefused) else public_error(error)
            await self.send_text(encoder.done(reason="error", error=message).decode())
            raise UtteranceFailed(message, stopped_engine(error)) from None
        end, done = encoder.finish()
        await self.send_bytes(end)
        await self.send_text(done.decode())


async def _pieces(queue: asyncio.Queue[str | None]) -> AsyncIterator[str]:
    while (piece := await queue.get()) is not None:
        yield piece


def _json(payload: dict[str, Any]) -> str:
    import json

    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
