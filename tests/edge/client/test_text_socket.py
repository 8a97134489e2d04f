"""The client's WebSocket session (``--text-stdin``): messages read as the socket delivers them, text cut by the
limits the server announces in its start message, bounded waits. A stand-in connection plays the server (the real
one: tests/entrypoints/server/test_serve_guard.py, started with lower limits)."""

from __future__ import annotations

import io
import json
import logging
import queue
import time

import numpy as np
import pytest

from vllm_omni.edge.client import EdgeClient
from vllm_omni.edge.client.text_socket import UNANNOUNCED_LIMITS, start_text_session
from vllm_omni.edge.plan import ExecPlan
from vllm_omni.edge.stream import KIND_JSON, SessionLimits
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.streams import segment_messages

LOW = SessionLimits(max_input_chars=10, max_body_bytes=64, socket_max_queued_chars=2000, socket_idle_s=3.0)
TEXT = 'Hello there, a text longer than ten characters: é ü and \U0001f600, with "quotes".\n'


class Server:
    """A websockets sync connection as the client sees it, playing a speech session: the start message at once,
    the frames once the client's ``end`` came (recv times out while none is due); every piece and message the
    client sends is checked against ``limits`` as the server checks them (the first breach is kept)."""

    def __init__(self, messages: list[tuple[bytes, bytes]], limits: SessionLimits, frames_after_end: bool = True):
        self.start, *self.rest = [m.decode() if kind == KIND_JSON else m for kind, m in messages]
        self.limits, self.frames_after_end = limits, frames_after_end
        self.sent: list[dict] = []
        self.sent_before_start: list[str] = []
        self.breach: str | None = None
        self.started = False
        self.incoming: queue.Queue = queue.Queue()
        self.closed = False

    def recv(self, timeout: float | None = None):
        if not self.started:
            self.started = True
            return self.start
        try:
            return self.incoming.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def send(self, message: str) -> None:
        if not self.started:
            self.sent_before_start.append(message)
        row = json.loads(message)
        self.sent.append(row)
        size = len(message.encode())
        if row["type"] == "text" and self.breach is None:
            if size > self.limits.max_body_bytes:
                self.breach = f"1009: a message of {size} bytes"
            elif len(row["text"]) > self.limits.max_input_chars:
                self.breach = f"4413: a piece of {len(row['text'])} characters"
        if row["type"] == "end" and self.frames_after_end:
            for message in self.rest:
                self.incoming.put(message)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def cpu(cpu_plan) -> ExecPlan:
    return ExecPlan.load(cpu_plan)


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return random_codes(14, 16, 2048, seed=5)[0].T.numpy().copy()


def session(cpu, frames, checked: SessionLimits, announced: dict | None) -> tuple[Server, list[tuple[bytes, bytes]]]:
    """A server that checks the client's text against ``checked`` and announces ``announced`` (None: nothing)."""
    messages = segment_messages(cpu, [frames], limits=announced)
    return Server(messages, checked), messages


def test_text_goes_in_the_pieces_the_servers_announced_limits_allow_after_its_start(cpu, frames):
    server, messages = session(cpu, frames, LOW, LOW.to_json())
    body = {"edge_hardware": cpu.hardware_class, "input": "x"}
    source = start_text_session(server, body, io.BytesIO(TEXT.encode()), 5)
    report = EdgeClient(cpu).run(source, [])
    source.close()
    assert report.error is None and report.frames == len(frames) and report.done_reason == "complete"
    assert server.breach is None, server.breach
    assert [json.loads(m)["type"] for m in server.sent_before_start] == ["start"], "text went before the limits"
    pieces = [row["text"] for row in server.sent if row["type"] == "text"]
    assert "".join(pieces) == TEXT and len(pieces) >= len(TEXT) // LOW.max_input_chars
    assert server.sent[0]["text_mode"] == "stream" and "input" not in server.sent[0]
    assert server.sent[-1] == {"type": "end"}
    # each WebSocket message was one protocol message, parsed once: payload bytes, no recording framing
    assert report.messages == len(messages)
    assert report.stream_bytes == sum(len(payload) for _, payload in messages)


def test_a_server_that_announces_no_limits_gets_the_old_defaults_and_a_warning(cpu, frames, caplog):
    server, _ = session(cpu, frames, UNANNOUNCED_LIMITS, None)
    text = "word " * 1000  # 5000 characters: two pieces at the old default of 4096
    with caplog.at_level(logging.WARNING, logger="vllm_omni.edge.client.text_socket"):
        source = start_text_session(server, {}, io.BytesIO(text.encode()), 5)
        report = EdgeClient(cpu).run(source, [])
    source.close()
    assert report.error is None and server.breach is None
    assert [len(row["text"]) for row in server.sent if row["type"] == "text"] == [4096, 904]
    assert any("announced no limits" in record.getMessage() for record in caplog.records)


def test_an_announcement_the_client_cannot_cut_text_by_ends_the_session_and_sends_no_text(cpu, frames):
    server, _ = session(cpu, frames, LOW, {**LOW.to_json(), "max_input_chars": "10"})
    source = start_text_session(server, {}, io.BytesIO(TEXT.encode()), 5)
    report = EdgeClient(cpu).run(source, [])
    source.close()
    assert "limits: max_input_chars must be int" in report.error and report.frames == 0
    time.sleep(0.2)  # the sender thread had its chance
    assert [row["type"] for row in server.sent] == ["start"]


def test_a_server_silent_after_the_text_ended_is_an_error_within_the_timeout(cpu, frames):
    server, _ = session(cpu, frames, LOW, LOW.to_json())
    server.frames_after_end = False  # the start, then nothing
    began = time.monotonic()
    source = start_text_session(server, {}, io.BytesIO(b"Hello."), 0.5)
    report = EdgeClient(cpu).run(source, [])
    assert report.error == "no message from the server in 0.5 s (--timeout sets the limit)"
    assert time.monotonic() - began < 10 and server.closed
