"""``vllm serve --omni`` under faults, each test on a server of its own: the engine core killed while every kind of
stream is open (each client reads an error, never a short success; the server exits non-zero), and SIGTERM while
streams are open (readiness fails at once, new work is refused, the streams finish equal to the same request sent
alone, the server exits 0 with no traceback in its log).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..serving import KEY, running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

# Sampled (seeded): a random-weight talker rarely picks EOS among 3,072 codes, so its streams run to max_frames and
# are open when the fault comes (greedy picks may end at once).
LONG = {"voice": "Ryan", "language": "English", "greedy": False, "seed": 7, "max_frames": 300}
LONG_TEXT = "Hello there, this is a long test of a stream that the server is speaking when it is cut."
AUTH = {"Authorization": f"Bearer {KEY}"}


@contextlib.contextmanager
def own_server(talker_checkpoint: Path, work: Path, shared_plans) -> Iterator:
    shared_plans.copy_to(talker_checkpoint, "cpu_x86_64", work / "artifacts" / "cpu_x86_64")
    with running_server(talker_checkpoint, work, "cpu_x86_64", ["--served-model-name", "qwen3-tts"]) as server:
        yield server


def engine_core(server) -> int:
    import psutil

    for child in psutil.Process(server.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child.pid
    raise AssertionError("no EngineCore process under the server")


class Stream(threading.Thread):
    """One client reading one stream; ``started`` once its first bytes came; ``outcome`` ``complete`` (with
    ``data``) or ``error: ...`` once it ended."""

    def __init__(self, name: str, read: Callable[[Stream], bytes]) -> None:
        super().__init__(name=name, daemon=True)
        self.read, self.started, self.outcome, self.data = read, threading.Event(), None, b""

    def run(self) -> None:
        try:
            self.data = self.read(self)
            self.outcome = "complete"
        except Exception as error:
            self.outcome = f"error: {type(error).__name__}: {error}"
        finally:
            self.started.set()


def http_audio(server, body: dict) -> Callable[[Stream], bytes]:
    """A streamed POST /v1/audio/speech read with httpx (a cut body raises)."""

    def read(stream: Stream) -> bytes:
        import httpx

        chunks = []
        with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, headers=AUTH, timeout=120) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:200]!r}")
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                stream.started.set()
        data = b"".join(chunks)
        if body.get("stream_format") == "sse":
            events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
            if events[-1]["type"] != "speech.audio.done":
                raise RuntimeError(f"the SSE stream ended with {events[-1]['type']}: {events[-1].get('error')}")
        if body.get("response_format") == "codec":
            import io

            from vllm_omni.edge.stream import StreamDone, iter_events

            done = [e for e in iter_events(io.BytesIO(data)) if isinstance(e, StreamDone)]
            if not done or done[-1].reason != "complete":
                raise RuntimeError(f"the codec stream ended with {done[-1] if done else 'no done message'}")
        return data

    return read


def socket_messages(socket, stream: Stream) -> tuple[bytes, list[dict]]:
    """Every message until the close: the binary ones joined (``stream.started`` at the first), the JSON ones."""
    binary, texts = [], []
    with contextlib.suppress(Exception):  # the close ends the loop
        while True:
            message = socket.recv(timeout=120)
            if isinstance(message, bytes):
                binary.append(message)
                stream.started.set()
            else:
                texts.append(json.loads(message))
    return b"".join(binary), texts


def upstream_socket(server, text: str, body: dict) -> Callable[[Stream], bytes]:
    """Upstream's WebSocket vocabulary: one utterance of streamed PCM, then session.close."""

    def read(stream: Stream) -> bytes:
        from websockets.sync.client import connect

        url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(url, additional_headers=AUTH, open_timeout=60) as socket:
            config = {"type": "session.config", "response_format": "pcm", "stream_audio": True, **body}
            for message in (config, {"type": "input.text", "text": text}, {"type": "input.done"}):
                socket.send(json.dumps(message))
            socket.send(json.dumps({"type": "session.close"}))
            audio, texts = socket_messages(socket, stream)
            errors = [message["message"] for message in texts if message["type"] == "error"]
            if errors or socket.close_code not in (1000, 1001):
                raise RuntimeError(f"closed {socket.close_code} {socket.close_reason}; errors {errors}")
        return audio

    return read


def first_socket(server, text: str, body: dict) -> Callable[[Stream], bytes]:
    """The first vocabulary: one codec stream of text in stream mode, then end."""

    def read(stream: Stream) -> bytes:
        from websockets.sync.client import connect

        url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(url, additional_headers=AUTH, open_timeout=60) as socket:
            start = {"type": "start", "edge_hardware": "cpu_x86_64", "text_mode": "stream", **body}
            for message in (start, {"type": "text", "text": text}, {"type": "end"}):
                socket.send(json.dumps(message))
            frames, _ = socket_messages(socket, stream)
            if socket.close_code != 1000:
                raise RuntimeError(f"closed {socket.close_code} {socket.close_reason}")
        return frames

    return read


def edge_client(server, text: str) -> Callable[[Stream], bytes]:
    """This project's edge client (the command a device runs): the codec stream decoded here, PCM on stdout; a
    non-zero exit is its error."""

    def read(stream: Stream) -> bytes:
        import subprocess
        import sys

        command = [sys.executable, "-m", "vllm_omni.edge", "client", "--server", server.url, "--hardware"]
        command += ["cpu_x86_64", "--text", text, "--voice", "Ryan", "--language", "English", "--seed", "7"]
        command += ["--max-frames", str(LONG["max_frames"]), "--api-key", KEY, "--pcm-stdout"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as client:
            audio = []
            while chunk := client.stdout.read1(65536):
                audio.append(chunk)
                stream.started.set()
            errors = client.stderr.read().decode(errors="replace")
            if client.wait(120) != 0:
                raise RuntimeError(f"the edge client exited {client.returncode}: {errors[-300:]}")
        return b"".join(audio)

    return read


def wait_for_exit(server, seconds: float) -> int:
    return server.process.wait(timeout=seconds)


def test_a_killed_engine_cuts_every_stream_as_an_error_and_the_server_exits_non_zero(
    talker_checkpoint, tmp_path, shared_plans
):
    import os

    with own_server(talker_checkpoint, tmp_path, shared_plans) as server:
        body = {**LONG, "input": LONG_TEXT}
        streams = [
            Stream("pcm", http_audio(server, {**body, "response_format": "pcm", "stream_format": "audio"})),
            Stream("wav", http_audio(server, {**body, "response_format": "wav", "stream_format": "audio"})),
            Stream("sse", http_audio(server, {**body, "response_format": "pcm", "stream_format": "sse"})),
            Stream("codec", http_audio(server, {**body, "response_format": "codec", "edge_hardware": "cpu_x86_64"})),
            Stream("upstream socket", upstream_socket(server, LONG_TEXT, LONG)),
            Stream("first socket", first_socket(server, LONG_TEXT, LONG)),
            Stream("edge client", edge_client(server, LONG_TEXT)),
        ]
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(120), f"{stream.name}: no first bytes"
        unfinished = [stream.name for stream in streams if stream.outcome is None]
        os.kill(engine_core(server), signal.SIGKILL)
        for stream in streams:
            stream.join(120)
        outcomes = {stream.name: stream.outcome for stream in streams if stream.name in unfinished}
        ended = {stream.name: (stream.outcome, len(stream.data)) for stream in streams}
        assert len(outcomes) >= 4, f"most streams must still run when the engine dies: {unfinished}, {ended}"
        assert all(outcome.startswith("error") for outcome in outcomes.values()), outcomes
        code = wait_for_exit(server, 90)
        assert code != 0
        assert "the engine core died" in server.log.read_text(errors="replace")


def test_sigterm_drains_open_streams_then_exits_zero(talker_checkpoint, tmp_path, shared_plans):
    import urllib.error
    import urllib.request

    with own_server(talker_checkpoint, tmp_path, shared_plans) as server:
        body = {**LONG, "max_frames": 200, "input": LONG_TEXT, "response_format": "pcm", "stream_format": "audio"}
        lone = Stream("lone", http_audio(server, body))
        lone.start()
        lone.join(300)
        assert lone.outcome == "complete" and lone.data
        streams = [Stream(f"pcm {index}", http_audio(server, body)) for index in range(2)]
        streams.append(Stream("upstream socket", upstream_socket(server, LONG_TEXT, {**LONG, "max_frames": 200})))
        for stream in streams:
            stream.start()
        for stream in streams:
            assert stream.started.wait(120), f"{stream.name}: no first bytes"
        assert [stream.outcome for stream in streams] == [None] * len(streams)  # all in flight at the signal
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        readiness = None
        while time.monotonic() - signalled < 5:  # readiness fails at once
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
                    readiness = response.status
            except urllib.error.HTTPError as error:
                readiness = error.code
                break
            time.sleep(0.05)
        assert readiness == 503
        refused = Stream("new", http_audio(server, body))
        refused.start()
        refused.join(60)
        assert refused.outcome.startswith("error") and "503" in refused.outcome, refused.outcome
        for stream in streams:
            stream.join(120)
        assert {stream.name: stream.outcome for stream in streams} == {stream.name: "complete" for stream in streams}
        assert [stream.data == lone.data for stream in streams[:2]] == [True, True]
        assert streams[2].data == lone.data  # the socket's PCM: the same utterance
        assert wait_for_exit(server, 90) == 0
        assert time.monotonic() - signalled < 60
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log and "the engine core died" not in log
