"""The client under hostile and broken input (issue 12): no hang, no traceback, nothing lost or overwritten."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.cli import client as client_cli
from vllm_omni.edge.cli.client import main as client_main
from vllm_omni.edge.client import EdgeClient, fetch_plan
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.streams import recording, segment_messages

HANG_SECONDS = 60  # longer is a hang, whatever the load (latencies belong in benchmarks)


@pytest.fixture(scope="module")
def cpu(cpu_plan) -> ExecPlan:
    return ExecPlan.load(cpu_plan)


@pytest.fixture(scope="module")
def stream_bytes(cpu) -> bytes:
    frames = random_codes(22, 16, 2048, seed=21)[0].T.numpy().copy()
    return recording(segment_messages(cpu, [frames]))


def wav_samples(path: Path) -> int:
    with wave.open(str(path)) as handle:
        return handle.getnframes()


class HostileServer:
    """An HTTP/1.1 server whose every response is written by ``behaviour(handler)``: cuts, stalls, resets."""

    def __init__(self, behaviour):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                with contextlib.suppress(OSError):  # the client went away: what a bounded client does
                    outer.behaviour(self)

            def log_message(self, *args):
                pass

        self.behaviour = behaviour
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def chunked_head(handler):
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def send_chunk(handler, data: bytes):
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def run_client(args: list[str], seconds: float = 60):
    """client_main in a thread, so that a hang fails the test instead of blocking it."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", client_main(args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the client hung for {seconds} s"
    return result["code"]


@pytest.mark.parametrize("how", ["cut inside a chunk", "stall", "reset"])
def test_a_broken_connection_ends_with_one_error_line_the_audio_and_the_report(
    cpu_plan, stream_bytes, tmp_path, capsys, how
):
    half = len(stream_bytes) // 2

    def behaviour(handler):
        chunked_head(handler)
        send_chunk(handler, stream_bytes[:half])
        time.sleep(0.3)
        if how == "cut inside a chunk":
            handler.wfile.write(b"400\r\n" + stream_bytes[half : half + 10])
            handler.wfile.flush()
        elif how == "stall":
            time.sleep(5)
        else:
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.close_connection = True
        handler.connection.close()

    server = HostileServer(behaviour)
    out, report = tmp_path / "speech.wav", tmp_path / "report.json"
    try:
        started = time.perf_counter()
        command = ["--stream", f"{server.url}/s", "--plan", str(cpu_plan), "--out", str(out), "--report", str(report)]
        code = run_client([*command, "--timeout", "1"])
        assert time.perf_counter() - started < HANG_SECONDS
    finally:
        server.close()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    expected = {"cut inside a chunk": "was cut after", "stall": "the server stalled", "reset": "failed after"}[how]
    assert expected in errors[0] and "speech.wav" in errors[0], errors[0]
    assert wav_samples(out) > 0 and not list(tmp_path.glob(".*partial*"))
    assert json.loads(report.read_text())["error"] == errors[0].removeprefix("error: ").split("; the audio")[0]


def test_a_reader_that_dies_of_an_unexpected_error_ends_the_run_instead_of_hanging_it(cpu, stream_bytes):
    class Exploding(io.BytesIO):
        def read(self, size=-1):
            if self.tell() > len(stream_bytes) // 2:
                raise RuntimeError("boom")
            return super().read(size)

    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("report", EdgeClient(cpu).run(Exploding(stream_bytes), [])), daemon=True
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the client hung on a dead reader"
    assert "RuntimeError: boom" in result["report"].error and result["report"].frames > 0


def test_an_interrupted_stdin_stream_keeps_its_audio_in_the_output_file(cpu_plan, stream_bytes, tmp_path, repo_root):
    out = tmp_path / "live.wav"
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_omni.edge", "client", "--stream", "-", "--plan", str(cpu_plan), "--out", str(out)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=repo_root,
    )
    try:
        process.stdin.write(stream_bytes[: len(stream_bytes) * 2 // 3])  # never ends: no done message, no EOF
        process.stdin.flush()
        partial = out.with_name(".live.partial.wav")
        deadline = time.time() + 120
        while not (partial.exists() and partial.stat().st_size > 44) and time.time() < deadline:
            time.sleep(0.1)
        assert partial.exists(), "no audio was decoded"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 1, err.decode()[-2000:]
    assert b"error: interrupted; the audio decoded so far" in err and b"Traceback" not in err
    assert wav_samples(out) > 0 and not partial.exists()


def test_a_garbage_stream_leaves_an_existing_wav_as_it_was(cpu_plan, tmp_path, capsys):
    important = tmp_path / "important.wav"
    with wave.open(str(important), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(24000)
        handle.writeframes(b"\x01\x02" * 1000)
    before = important.read_bytes()
    (tmp_path / "garbage.qcs").write_bytes(b"this is not a codec stream at all")
    code = client_main(["--stream", str(tmp_path / "garbage.qcs"), "--plan", str(cpu_plan), "--out", str(important)])
    assert code == 1 and "not a codec-stream recording" in capsys.readouterr().err
    assert important.read_bytes() == before and not list(tmp_path.glob(".*partial*"))


def test_outputs_that_cannot_or_must_not_be_written_are_refused_before_decoding(
    cpu_plan, stream_bytes, tmp_path, capsys, monkeypatch
):
    stream = tmp_path / "x.qcs"
    stream.write_bytes(stream_bytes)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    (tmp_path / "dir").mkdir()
    base = ["--stream", str(stream), "--plan", str(cpu_plan)]
    cases = {
        "is an input of this run": ["--out", str(stream)],
        "is a directory": ["--out", str(tmp_path / "dir")],
        "--report": ["--out", str(tmp_path / "a.wav"), "--report", str(tmp_path / "dir")],
        "exists and is not a WAV file": ["--out", str(notes)],
        f"--out {notes / 'sub' / 'a.wav'} cannot be written: {notes} is a file": [
            "--out",
            str(notes / "sub" / "a.wav"),
        ],
        f"--report {notes / 'sub' / 'r.json'} cannot be written": [
            "--out",
            str(tmp_path / "a.wav"),
            "--report",
            str(notes / "sub" / "r.json"),
        ],
    }
    for message, extra in cases.items():
        with monkeypatch.context() as patched:  # refused up front: nothing is decoded
            patched.setattr(
                client_cli, "_run", lambda args, message=message: pytest.fail(f"{message}: decoding started")
            )
            assert client_main([*base, *extra]) == 2, message
        assert message in capsys.readouterr().err
    assert stream.read_bytes() == stream_bytes and notes.read_text() == "my notes"
    assert not (tmp_path / "a.wav").exists()
    assert client_main([*base, "--out", str(notes), "--force"]) == 0 and wav_samples(notes) > 0


def test_a_start_message_with_another_frame_rate_is_refused(cpu, stream_bytes):
    frames = random_codes(6, 16, 2048, seed=1)[0].T.numpy().copy()
    data = recording(segment_messages(cpu, [frames], frame_rate=cpu.codec.frame_rate * 2))
    report = EdgeClient(cpu).run(io.BytesIO(data), [])
    assert "frame_rate: stream 1000.0, plan 500.0" in report.error and report.frames == 0


def test_plan_downloads_are_capped_at_the_declared_size_and_leave_no_staging(cpu_plan, cpu, tmp_path):
    plan_text = (Path(cpu_plan) / "exec_plan.json").read_bytes()
    sent = {"bytes": 0}

    def behaviour(handler):
        if handler.path.endswith("exec_plan.json"):
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(plan_text)))
            handler.end_headers()
            handler.wfile.write(plan_text)
            return
        chunked_head(handler)  # an endless body
        block = b"\0" * (1 << 16)
        while sent["bytes"] < 1 << 30:
            send_chunk(handler, block)
            sent["bytes"] += len(block)

    server = HostileServer(behaviour)
    cache = tmp_path / "cache"
    try:
        with pytest.raises(ExecPlanError, match="more than the .* bytes the plan declares"):
            fetch_plan(f"{server.url}/plan/", cache, timeout=5)
    finally:
        server.close()
    largest = max(a.size_bytes for a in cpu.artifacts.values())
    assert sent["bytes"] < largest + (64 << 20)  # stopped reading soon after the cap (socket buffers aside)
    assert not list(cache.rglob(".*partial*")) and not list(cache.glob(".incoming*"))


def test_a_served_plan_leaves_no_staging_behind(cpu_plan, tmp_path):
    root = tmp_path / "www"
    shutil.copytree(cpu_plan, root / "plan")
    server = HostileServer(lambda handler: _serve_file(handler, root))
    cache = tmp_path / "cache"
    (cache / ".incoming").mkdir(parents=True)  # what an older client, killed, left behind
    (cache / ".incoming" / "exec_plan.json").write_text("{}")
    old = time.time() - 7200
    os.utime(cache / ".incoming", (old, old))
    try:
        plan = fetch_plan(f"{server.url}/plan/", cache)
    finally:
        server.close()
    assert plan.directory == cache / plan.plan_id
    assert sorted(p.name for p in cache.iterdir()) == [plan.plan_id]


def _serve_file(handler, root: Path):
    path = root / handler.path.lstrip("/")
    if not path.is_file():
        handler.send_error(404)
        return
    data = path.read_bytes()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_a_client_wav_left_from_a_killed_run_is_reused_not_kept(cpu_plan, stream_bytes, tmp_path):
    stream = tmp_path / "s.qcs"
    stream.write_bytes(stream_bytes)
    (tmp_path / ".out.partial.wav").write_bytes(b"left by a killed run")
    assert client_main(["--stream", str(stream), "--plan", str(cpu_plan), "--out", str(tmp_path / "out.wav")]) == 0
    assert wav_samples(tmp_path / "out.wav") > 0 and not (tmp_path / ".out.partial.wav").exists()
    np.testing.assert_equal(sorted(p.name for p in tmp_path.iterdir()), ["out.wav", "s.qcs"])


def test_a_served_plan_with_a_runaway_schedule_is_refused_before_any_download(cpu_plan, tmp_path):
    from vllm_omni.edge.plan.model import _plan_digest

    payload = json.loads((Path(cpu_plan) / "exec_plan.json").read_text())
    payload["graph_kind"], payload["windowed"] = "windowed", {"ramp": [1], "context_frames": 10**8}
    payload["plan_id"] = _plan_digest({k: v for k, v in payload.items() if k != "plan_id"})
    root = tmp_path / "www" / "plan"
    root.mkdir(parents=True)
    (root / "exec_plan.json").write_text(json.dumps(payload))
    server = HostileServer(lambda handler: _serve_file(handler, tmp_path / "www"))
    started = time.perf_counter()
    try:
        with pytest.raises(ExecPlanError, match="context_frames: 100000000 is greater than the maximum of 4096"):
            fetch_plan(f"{server.url}/plan/", tmp_path / "cache")
    finally:
        server.close()
    assert time.perf_counter() - started < HANG_SECONDS
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []
