"""What every ``/v1/audio/speech/stream`` session has, whichever vocabulary its client speaks: close codes and
reasons, one checked client message at a time, sends that notice a client gone, the session's deadlines, and the
voice resolved once per session.

Two vocabularies share it: upstream vLLM-Omni's (``session.config`` / ``input.text`` / ``input.done`` /
``session.close``, :mod:`.speech_session`, the current one) and this project's first (``start`` / ``text`` /
``flush`` / ``end`` / ``cancel``, :mod:`.speech_socket`, kept as an alias for the clients written against it). The
first message of a connection says which (:func:`open_session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, NoReturn

from vllm_omni.errors import RequestRefused

from ..openai.speech_api import SpeechApiError, parse_json, to_speech_request
from ..openai.speech_limits import SpeechLimits
from ..server.lifecycle import LIFECYCLE
from ..server.serving_state import ServingState
from ..server.speech_metrics import speech_metrics

# WebSocket close codes (4000-4999 are the application's): what went wrong with the client's messages.
CLOSE_TOO_BIG = 1009  # RFC 6455: a message too big to process
TEXT_TIMEOUT_GRACE_S = 2.0  # the talker's text timeout is the idle limit and this (SocketSession.text_timeout_s)
CLOSE_BAD_MESSAGE = 4400
CLOSE_NOT_SERVED = 4404
CLOSE_TIMEOUT = 4408
CLOSE_TOO_MUCH_QUEUED = 4413
CLOSE_NOT_READY = 4503
CLOSE_TRY_AGAIN_LATER = 1013  # RFC 6455: the server is overloaded (--speech-max-sockets sessions are open)
CLOSE_GOING_AWAY = 1001  # RFC 6455: the server is going down (it drains: SIGTERM)
CLOSE_SERVER_ERROR = 1011  # RFC 6455: the server failed while speaking
SLACK_S = 0.05  # how early a deadline may wake the socket's wait
CLOSE_SEND_S = 5.0  # the done and close frames wait this long for a client that does not read
MAX_REASON_BYTES = 123  # RFC 6455: a close reason fits in 123 bytes of UTF-8


def failure_code() -> int:
    """The close code of a session whose speech failed inside the server: going away while the server drains (its
    engine stopped at the end of ``--shutdown-timeout``), a server error otherwise."""
    return CLOSE_GOING_AWAY if LIFECYCLE.draining else CLOSE_SERVER_ERROR


def refusal_code(error: RequestRefused) -> int:
    """The close code of a refused request: try again later for a full queue (503), a bad message otherwise."""
    return CLOSE_TRY_AGAIN_LATER if error.status == 503 else CLOSE_BAD_MESSAGE


def close_reason(message: str) -> str:
    """``message`` fitted to a close frame: cut at a word boundary with an ellipsis when too long."""
    data = message.encode()
    if len(data) <= MAX_REASON_BYTES:
        return message
    cut = data[: MAX_REASON_BYTES - 3].decode(errors="ignore")
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "..."


class SocketClosed(Exception):
    """The session is over (closed by us after telling the client why, or by the client)."""


class ProtocolError(Exception):
    """A client message the session refuses: the close ``code`` and what to send instead."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_message(message: dict, limit: int) -> dict:
    """A received ASGI message as the client's JSON object (``{"type": "disconnect"}`` when it left)."""
    if message["type"] == "websocket.disconnect":
        return {"type": "disconnect"}
    text = message.get("text")
    if text is None:
        raise ProtocolError(CLOSE_BAD_MESSAGE, "expected a JSON text message with a string 'type', got binary")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limit:
        raise ProtocolError(CLOSE_TOO_BIG, f"a message of {size} bytes; the limit is {limit} (--speech-max-body-bytes)")
    try:
        payload = parse_json(text, "the message")
    except SpeechApiError as error:
        raise ProtocolError(CLOSE_BAD_MESSAGE, str(error)) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        raise ProtocolError(CLOSE_BAD_MESSAGE, "expected a JSON text message with a string 'type'")
    return payload


class UtteranceQueue:
    """What a session holds unspoken, bounded alike in every vocabulary: the utterances queued (upstream's: each
    ``input.done``; the first vocabulary's: each sentence) by count (``--speech-socket-max-queued-utterances``)
    and by characters (``--speech-socket-max-queued-chars``), and a streamed utterance's text by the latter.
    :meth:`admit` before one is queued, :meth:`taken` when the speaker takes it; past a bound, a
    :class:`ProtocolError` with close 4413 whose message is the same in both vocabularies."""

    def __init__(self, limits: SpeechLimits) -> None:
        self.limits = limits
        self.count = 0
        self.chars = 0

    def admit(self, chars: int) -> None:
        """One more utterance of ``chars`` characters queued, or a :class:`ProtocolError` (nothing counted)."""
        limits = self.limits
        count, total = self.count + 1, self.chars + chars
        if count > limits.socket_max_queued_utterances:
            raise ProtocolError(
                CLOSE_TOO_MUCH_QUEUED,
                f"{count} utterances queued; a session holds {limits.socket_max_queued_utterances} "
                "(--speech-socket-max-queued-utterances): send more as they are spoken",
            )
        if total > limits.socket_max_queued_chars:
            raise ProtocolError(
                CLOSE_TOO_MUCH_QUEUED,
                f"{total} characters queued; a session holds {limits.socket_max_queued_chars} "
                "(--speech-socket-max-queued-chars): send more as they are spoken",
            )
        self.count, self.chars = count, total

    def taken(self, chars: int) -> None:
        """The speaker took an utterance of ``chars`` characters: it is no longer waiting."""
        self.count -= 1
        self.chars -= chars

    def check_streamed(self, chars: int, hint: str) -> None:
        """A streamed utterance's text so far (``chars``), or a :class:`ProtocolError`; ``hint``: what to do."""
        limit = self.limits.socket_max_queued_chars
        if chars > limit:
            raise ProtocolError(
                CLOSE_TOO_MUCH_QUEUED,
                f"the utterance's text is {chars} characters; one streamed utterance takes at most {limit} "
                f"(--speech-socket-max-queued-chars): {hint}",
            )


class SocketSession:
    """The lifecycle of one connection: :meth:`receive` (a checked client message, or a close with its code),
    :meth:`close` (a reason fitted to the close frame, after the stream's own last word where one is open), sends
    that raise :class:`SocketClosed` when the client is gone, and the session's clock."""

    def __init__(self, serving: ServingState, socket: Any, speech_model: Any) -> None:
        self.speech, self.plans = serving.speech, serving.plans
        self.socket, self.speech_model = socket, speech_model
        self.started = time.monotonic()
        self.speaker: asyncio.Task | None = None
        self.queued = UtteranceQueue(serving.speech.limits)  # utterances waiting to be spoken

    async def last_words(self, code: int, message: str) -> None:
        """What the client hears before a close with ``code`` (nothing here; each vocabulary says its own)."""

    async def close(self, code: int, message: str) -> NoReturn:
        """Close with ``message`` as the reason, after :meth:`last_words`. Raises :class:`SocketClosed`: the session
        is over."""
        speaker = self.speaker
        if speaker is not None and speaker is not asyncio.current_task() and not speaker.done():
            speaker.cancel()  # nothing may follow the last words
            await asyncio.gather(speaker, return_exceptions=True)
        with contextlib.suppress(Exception):  # the client left first, or does not read: nobody to tell
            await asyncio.wait_for(self.last_words(code, message), CLOSE_SEND_S)
            await asyncio.wait_for(self.socket.close(code=code, reason=close_reason(message)), CLOSE_SEND_S)
        raise SocketClosed

    async def receive(self, timeout: float | None = None, waiting_for: str = "a message") -> dict:
        """The next client message, checked (a bad one closes the session with its code)."""
        try:
            raw = await asyncio.wait_for(self.socket.receive(), timeout)
        except TimeoutError:
            await self.close(CLOSE_TIMEOUT, f"no {waiting_for} in {timeout:g} s")
        return await self.checked(raw)

    async def within_bounds(self, check: Any, *args: Any) -> None:
        """``check(*args)`` (an :class:`UtteranceQueue` bound); the session closes with its refusal past it."""
        try:
            check(*args)
        except ProtocolError as error:
            speech_metrics().refused("queued_text")
            await self.close(error.code, str(error))

    async def checked(self, raw: dict) -> dict:
        try:
            return parse_message(raw, self.speech.limits.max_body_bytes)
        except ProtocolError as error:
            await self.close(error.code, str(error))

    @property
    def text_timeout_s(self) -> float:
        """The talker's own text timeout of a stream-mode utterance: a backstop to the idle close (which comes first,
        with its hint), ending an utterance whose socket did not."""
        return self.speech.limits.socket_idle_s + TEXT_TIMEOUT_GRACE_S

    def session_time_left(self) -> float:
        return self.speech.limits.socket_max_s - (time.monotonic() - self.started)

    # -- what each vocabulary says: its messages, when it is idle -----------------------------------------------

    IDLE_HINT = "send a message"  # what the idle close tells the client to send

    async def handle(self, message: dict) -> bool:
        """One checked client message (``{"type": "disconnect"}`` when it left); True when the session is over."""
        raise NotImplementedError

    def last_activity(self, last_message: float) -> float:
        """When the session last showed life (``last_message``: its client's last message)."""
        return last_message

    def idle_closes(self) -> bool:
        """Whether a session idle past ``--speech-socket-idle-s`` closes now; False while it speaks (its client
        is listening, not idle)."""
        return True

    # -- the session's loop -------------------------------------------------------------------------------------

    async def serve(self, speaking: Coroutine[Any, Any, None]) -> None:
        """``speaking`` as the session's speaker task while :meth:`listen` reads the client; the speaker is cancelled
        (its engine requests aborted) when listening ends first."""
        self.speaker = asyncio.create_task(speaking)
        try:
            await self.listen()
        finally:
            if not self.speaker.done():
                self.speaker.cancel()
            await asyncio.gather(self.speaker, return_exceptions=True)

    async def listen(self) -> None:
        """Client messages to :meth:`handle` until it says the session is over or the speaker ends; the session's
        deadlines hold throughout (the whole session's, and idleness as :meth:`last_activity` and
        :meth:`idle_closes` say)."""
        speaker, limits = self.speaker, self.speech.limits
        last_message = time.monotonic()
        receive: asyncio.Task | None = None
        try:
            while not speaker.done():
                receive = receive or asyncio.create_task(self.socket.receive())
                idle_left = limits.socket_idle_s - (time.monotonic() - self.last_activity(last_message))
                timeout = max(0.0, min(idle_left, self.session_time_left()))
                done, _ = await asyncio.wait({receive, speaker}, timeout=timeout, return_when="FIRST_COMPLETED")
                if speaker in done and receive not in done:
                    return
                if not done:  # a deadline (asyncio may wake a little early: SLACK_S)
                    if self.session_time_left() <= SLACK_S:
                        await self.close(CLOSE_TIMEOUT, f"the session is over its {limits.socket_max_s:g} s limit")
                    now = time.monotonic()
                    if now - self.last_activity(last_message) >= limits.socket_idle_s - SLACK_S:
                        if self.idle_closes():
                            await self.close(CLOSE_TIMEOUT, f"idle for {limits.socket_idle_s:g} s: {self.IDLE_HINT}")
                        last_message = now  # still speaking: the client is listening, not idle
                    continue
                raw, receive = receive.result(), None
                last_message = time.monotonic()
                if await self.handle(await self.checked(raw)):
                    return
        finally:
            if receive is not None and not receive.done():
                receive.cancel()

    async def send_text(self, text: str) -> None:
        await self._send(self.socket.send_text, text)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.socket.send_bytes, data)

    @staticmethod
    async def _send(send: Any, data: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await send(data)
        except (WebSocketDisconnect, OSError, RuntimeError):  # the client left (or the socket is closing)
            raise SocketClosed from None

    async def voice_template(self, body: Any) -> Any:
        """The session's ``SpeechRequest`` without text: its voice resolved once (an uploaded one read, a reference
        fetched and encoded), and the voice, instruction and language checked against the checkpoint without any
        tokenization. Raises a :class:`~vllm_omni.errors.RequestRefused`."""
        import dataclasses

        template = to_speech_request(body.model_copy(update={"input": "."}), self.speech.voices.store)
        template = await self.speech.resolve_voice(template)
        prompts = self.speech.generator.prompts
        prompts.check_voice_fields(template.speaker, template.instruct, template.voice)
        prompts.language_id(template.language, template.speaker)
        return dataclasses.replace(template, text=None)
