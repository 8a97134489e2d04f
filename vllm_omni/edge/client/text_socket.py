"""Text that arrives while it is spoken: a text source (an LLM piped into standard input) sent over the server's
WebSocket (:data:`~vllm_omni.edge.stream.SOCKET_PATH`, ``"text_mode": "stream"``), and the codec stream it answers
with received message by message (:class:`SocketMessages`): each WebSocket message is one message of the
protocol, parsed once by the session's parser, with nothing re-framed.

A thread reads the text source as it comes (``os.read`` of whatever is there, UTF-8 decoded incrementally, so a
character split across reads is whole) and sends each read as ``text`` pieces, then ``end`` at end of input. The
pieces are cut by the limits the server announces in its start message
(:class:`~vllm_omni.edge.stream.SessionLimits`), so text waits for that message; a server that announces none (one
older than the announcement) gets :data:`UNANNOUNCED_LIMITS`, its defaults, with a warning. Needs the ``websockets``
package (in the ``client`` extra).
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import logging
import os
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..errors import ClientError
from ..stream import KIND_BINARY, KIND_JSON, SOCKET_PATH, SessionLimits, StreamStart
from .session import END, IDLE, MessageSource
from .transport import NETWORK_TIMEOUT_S

logger = logging.getLogger(__name__)

READ_BYTES = 4096  # one read of the text source; a piece is what one read gave, cut by the server's limits
# What a server that announces no limits took by default: its flags' defaults before the announcement. Only such a
# server gets these; one started with lower limits closes a client that uses them (upgrade the server).
UNANNOUNCED_LIMITS = SessionLimits(
    max_input_chars=4096, max_body_bytes=1 << 20, socket_max_queued_chars=16384, socket_idle_s=60.0
)


def socket_url(server: str) -> str:
    url = urllib.parse.urlsplit(server.rstrip("/"))
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(url.scheme)
    if scheme is None:
        raise ClientError(f"--server must be an http(s) URL, got {server!r}")
    return urllib.parse.urlunsplit((scheme, url.netloc, url.path + SOCKET_PATH, "", ""))


def text_messages(text: str, limits: SessionLimits) -> Iterator[str]:
    """``text`` as ``text`` messages the server takes: each piece at most ``max_input_chars`` characters and each
    message at most ``max_body_bytes`` UTF-8 bytes (a piece over that is halved until it fits; a single character
    that still does not fit is sent, and the server's refusal says why)."""
    size = limits.max_input_chars
    pieces = deque(text[at : at + size] for at in range(0, len(text), size))
    while pieces:
        piece = pieces.popleft()
        message = json.dumps({"type": "text", "text": piece}, ensure_ascii=False)
        if len(message.encode("utf-8", errors="surrogatepass")) > limits.max_body_bytes and len(piece) > 1:
            half = len(piece) // 2
            pieces.extendleft([piece[half:], piece[:half]])
            continue
        yield message


class SocketMessages(MessageSource):
    """The session's messages as the WebSocket delivers them: a text message is a JSON message (kind ``J``), a
    binary one a frames message (kind ``B``).

    A close that is not ``1000`` before the stream's ``done`` is an error naming the server's code and reason. Once
    the text has ended, a wait for a message is bounded by ``timeout`` (before that the server's idle limit bounds
    it). :meth:`started` takes the server's limits from its start message and lets the text be sent.
    """

    def __init__(self, connection: Any, timeout: float) -> None:
        self.connection, self.timeout = connection, timeout
        self.limits: SessionLimits | None = None
        self.limits_known = threading.Event()  # the start message came (or the session ended before it)
        self.text_done = threading.Event()  # the text source ended and `end` went out (or sending failed)
        self.send_errors: list[Exception] = []
        self.last_message = time.monotonic()
        self.finished = False

    def receive(self, idle_s: float | None) -> Any:
        while not self.finished:
            try:
                message = self.connection.recv(timeout=self.timeout if idle_s is None else idle_s)
            except TimeoutError:
                silent = time.monotonic() - self.last_message
                if self.text_done.is_set() and silent >= self.timeout:
                    self.close()
                    raise ClientError(
                        f"no message from the server in {self.timeout:g} s (--timeout sets the limit)"
                    ) from None
                if idle_s is not None:
                    return IDLE
                continue  # the talker waits for text that has not come: the server's idle limit bounds this
            except Exception as error:  # the connection closed
                return self._closed(error)
            self.last_message = time.monotonic()
            if isinstance(message, str):
                return KIND_JSON, message.encode("utf-8", errors="surrogatepass")
            return KIND_BINARY, bytes(message)
        return END

    def _closed(self, error: Exception) -> Any:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        self.finished = True
        self.limits_known.set()
        if isinstance(error, ConnectionClosedOK):
            return END
        if not isinstance(error, ConnectionClosed):  # the transport failed under us
            raise ClientError(f"receiving from the server failed: {type(error).__name__}: {error}") from None
        received = error.rcvd
        reason = f"{received.code} {received.reason}" if received is not None else "no close frame"
        failed = f" (sending the text failed first: {self.send_errors[0]})" if self.send_errors else ""
        raise ClientError(f"the server closed the speech session: {reason}{failed}") from None

    def started(self, start: StreamStart) -> None:
        if start.limits is None:
            logger.warning(
                "the server announced no limits (a server older than this client): sending text in pieces of at "
                "most %d characters, as its defaults took",
                UNANNOUNCED_LIMITS.max_input_chars,
            )
            self.limits = UNANNOUNCED_LIMITS
        else:
            self.limits = SessionLimits.from_json(start.limits)  # a malformed announcement ends the session
        self.limits_known.set()

    def send_text(self, source: BinaryIO) -> None:
        """Each read of ``source`` as ``text`` messages (:func:`text_messages`), then ``end``; sends nothing before
        the server's limits are known, nor after the session ended."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            try:
                fd = source.fileno()
            except (AttributeError, OSError, io.UnsupportedOperation):
                fd = None  # not a file descriptor (a test's BytesIO): plain reads
            self.limits_known.wait()
            limits = self.limits
            if limits is None:
                return  # the session ended before its start message: its error reaches the receiver
            while True:
                data = os.read(fd, READ_BYTES) if fd is not None else source.read(READ_BYTES)
                for message in text_messages(decoder.decode(data, final=not data), limits):
                    self.connection.send(message)
                if not data:
                    break
            self.connection.send(json.dumps({"type": "end"}))
        except Exception as error:  # the server closed first (its reason reaches the receiver) or the source failed
            self.send_errors.append(error)
        finally:
            self.text_done.set()

    def close(self) -> None:
        self.finished = True
        self.limits_known.set()
        with contextlib.suppress(Exception):
            self.connection.close()


def open_text_stream(
    server: str, body: dict[str, Any], source: BinaryIO, key: str | None, timeout: float = NETWORK_TIMEOUT_S
) -> SocketMessages:
    """Start a streamed-text session (``body``: the start message's speech fields) and feed it ``source``."""
    try:
        from websockets.sync.client import connect
    except ImportError:
        raise ClientError("--text-stdin needs the websockets package: pip install 'vllm-omni-edge[client]'") from None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        connection = connect(socket_url(server), additional_headers=headers, open_timeout=timeout)
        return start_text_session(connection, body, source, timeout)
    except ClientError:
        raise
    except Exception as error:  # refused handshake (401, 403), unreachable server, timeout
        raise ClientError(f"cannot open the speech WebSocket of {server}: {type(error).__name__}: {error}") from None


def start_text_session(connection: Any, body: dict[str, Any], source: BinaryIO, timeout: float) -> SocketMessages:
    """On an open ``connection``: the start message (``body`` less its ``input``), then a thread sending
    ``source`` once the server's limits are known; the session's messages."""
    start = {key: value for key, value in body.items() if key != "input"}
    connection.send(json.dumps({"type": "start", "text_mode": "stream", **start}))
    messages = SocketMessages(connection, timeout)
    threading.Thread(target=messages.send_text, args=(source,), daemon=True).start()
    return messages
