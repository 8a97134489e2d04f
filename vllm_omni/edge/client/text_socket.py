"""Text that arrives while it is spoken: a text source (an LLM piped into standard input) sent over the server's
WebSocket (``/v1/audio/speech/stream``, ``"text_mode": "stream"``) and the codec stream it answers with read back
as the recording format the client already decodes.

Two threads: one reads the text source as it comes (``os.read`` of whatever is there, UTF-8 decoded
incrementally, so a character split across reads is whole) and sends each read as a ``text`` piece, then
``end`` at end of input; the client's reader thread reads the returned stream from :class:`SocketStream`. Needs
the ``websockets`` package (in the ``client`` extra).
"""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import os
import threading
import urllib.parse
from typing import Any, BinaryIO

from ..errors import ClientError
from ..stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, record
from .transport import NETWORK_TIMEOUT_S

SOCKET_PATH = "/v1/audio/speech/stream"
READ_BYTES = 4096  # one read of the text source; a piece is what one read gave
MAX_PIECE_CHARS = 4096  # the server's default piece limit (--speech-max-input-chars)


def socket_url(server: str) -> str:
    url = urllib.parse.urlsplit(server.rstrip("/"))
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(url.scheme)
    if scheme is None:
        raise ClientError(f"--server must be an http(s) URL, got {server!r}")
    return urllib.parse.urlunsplit((scheme, url.netloc, url.path + SOCKET_PATH, "", ""))


class SocketStream(io.RawIOBase):
    """The session's messages as the recording format (magic, then one framed record per message), read by the
    client like any stream. A close that is not ``1000`` before the stream's ``done`` is an error naming the
    server's code and reason; a wait for a message is bounded by ``timeout`` once the text has ended (before that
    the server's idle limit bounds it)."""

    def __init__(self, connection: Any, text_done: threading.Event, timeout: float) -> None:
        self.connection, self.text_done, self.timeout = connection, text_done, timeout
        self.buffer = bytearray(RECORDING_MAGIC)
        self.finished = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self.buffer and not self.finished:
            self._receive()
        size = min(len(target), len(self.buffer))
        target[:size] = self.buffer[:size]
        del self.buffer[:size]
        return size

    def _receive(self) -> None:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        try:
            message = self.connection.recv(timeout=self.timeout)
        except TimeoutError:
            if self.text_done.is_set():
                raise ClientError(
                    f"no message from the server in {self.timeout:g} s (--timeout sets the limit)"
                ) from None
            return  # the talker waits for text that has not come: the server's idle limit bounds this
        except ConnectionClosedOK:
            self.finished = True
            return
        except ConnectionClosed as closed:
            self.finished = True
            received = closed.rcvd
            reason = f"{received.code} {received.reason}" if received is not None else "no close frame"
            raise ClientError(f"the server closed the speech session: {reason}") from None
        if isinstance(message, str):
            self.buffer += record(KIND_JSON, message.encode())
        else:
            self.buffer += record(KIND_BINARY, message)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()
        super().close()


def _send_text(connection: Any, source: BinaryIO, done: threading.Event, errors: list) -> None:
    """Each read of ``source`` as a ``text`` piece (pieces past the server's limit split), then ``end``."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        try:
            fd = source.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            fd = None  # not a file descriptor (a test's BytesIO): plain reads
        while True:
            data = os.read(fd, READ_BYTES) if fd is not None else source.read(READ_BYTES)
            text = decoder.decode(data, final=not data)
            for start in range(0, len(text), MAX_PIECE_CHARS):
                connection.send(json.dumps({"type": "text", "text": text[start : start + MAX_PIECE_CHARS]}))
            if not data:
                break
        connection.send(json.dumps({"type": "end"}))
    except Exception as error:  # the server closed first (its reason reaches the reader) or the source failed
        errors.append(error)
    finally:
        done.set()


def open_text_stream(
    server: str, body: dict[str, Any], source: BinaryIO, key: str | None, timeout: float = NETWORK_TIMEOUT_S
) -> SocketStream:
    """Start a streamed-text session (``body``: the start message's speech fields) and feed it ``source``."""
    try:
        from websockets.sync.client import connect
    except ImportError:
        raise ClientError("--text-stdin needs the websockets package: pip install 'vllm-omni-edge[client]'") from None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        connection = connect(socket_url(server), additional_headers=headers, open_timeout=timeout)
        start = {key: value for key, value in body.items() if key != "input"}
        connection.send(json.dumps({"type": "start", "text_mode": "stream", **start}))
    except ClientError:
        raise
    except Exception as error:  # refused handshake (401, 403), unreachable server, timeout
        raise ClientError(f"cannot open the speech WebSocket of {server}: {type(error).__name__}: {error}") from None
    done, errors = threading.Event(), []
    threading.Thread(target=_send_text, args=(connection, source, done, errors), daemon=True).start()
    return SocketStream(connection, done, timeout)
