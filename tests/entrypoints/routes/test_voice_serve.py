"""A Base checkpoint served: voices uploaded once and used by name, and the cloned voice decoded on a device.

``vllm serve`` on a random-weight Base checkpoint whose speech tokenizer is the serving tests' (so their
CPU plan serves it too). Its decoder geometry makes 500 frames per second of reference audio, so the
reference is a 0.2 s clip of an espeak-ng recording (100 frames): the engine's 512 positions hold it.

The server runs two API server processes (``--api-server-count 2``), each with its own voice store on the one
directory: every test here goes through both, and the last ones check that they agree (one upload of a name
wins, the limits hold, a voice replaced through one is spoken anew by the other).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import io
import json
import shutil
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_omni.edge.stream import FrameBatch, iter_events

from ..serving import KEY, as_recording, client_speaks_the_full_decode, running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

MARKER = b"PLANTED-MARKER-7f3a9c"  # a fetched or local file that is not audio: no answer may quote it
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "voices"
REFERENCE_TEXT = "The quick"
SAY = {"input": "Hello from a cloned voice.", "language": "English", "greedy": True, "max_frames": 20}


def first_fifth_second(name: str) -> bytes:
    """The first 0.2 s of a fixture recording (22.05 kHz WAV bytes)."""
    with wave.open(str(FIXTURES / name)) as handle:
        rate, frames = handle.getframerate(), handle.readframes(handle.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(rate)
        handle.writeframes(frames[: int(0.2 * rate) * 2])
    return out.getvalue()


@pytest.fixture(scope="module")
def clip() -> bytes:
    """The first 0.2 s of ref_a."""
    return first_fifth_second("ref_a_22k.wav")


@pytest.fixture(scope="module")
def base_checkpoint(talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Base talker beside the serving tests' speech tokenizer (the same bytes, so the same plans)."""
    from vllm_omni.testing.talker_checkpoint import write_talker_files

    out = tmp_path_factory.mktemp("base-serve") / "ckpt"
    shutil.copytree(talker_checkpoint / "speech_tokenizer", out / "speech_tokenizer")
    return write_talker_files(out, "tiny", seed=3, model_type="base")


class _Media(http.server.BaseHTTPRequestHandler):
    """Reference audio on loopback, as a client's media host: ``/clip.wav`` (the server's ``clip``), ``/moved``
    (a redirect within the host), ``/elsewhere`` (a redirect to ``127.0.0.1``, another host), ``/marker`` (text
    that is not audio: :data:`MARKER`)."""

    def do_GET(self):
        port = self.server.server_address[1]
        where = {"/moved": "/clip.wav", "/elsewhere": f"http://127.0.0.1:{port}/clip.wav"}.get(self.path)
        if self.path == "/marker":
            self.send_response(200)
            self.send_header("Content-Length", str(len(MARKER)))
            self.end_headers()
            self.wfile.write(MARKER)
            return
        if self.path == "/clip.wav":
            self.send_response(200)
            self.send_header("Content-Type", "audio/wav")
            self.send_header("Content-Length", str(len(self.server.clip)))
            self.end_headers()
            self.wfile.write(self.server.clip)
            return
        self.send_response(302 if where else 404)
        if where:
            self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def media(clip: bytes, tmp_path_factory: pytest.TempPathFactory):
    """A loopback media host serving ``clip`` (its base URL), and a directory holding it (for
    ``--allowed-local-media-path``)."""
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    host.clip = clip
    threading.Thread(target=host.serve_forever, daemon=True).start()
    directory = tmp_path_factory.mktemp("media")
    (directory / "clip.wav").write_bytes(clip)
    (directory / "marker.wav").write_bytes(MARKER)
    yield SimpleNamespace(url=f"http://localhost:{host.server_address[1]}", directory=directory)
    host.shutdown()


@pytest.fixture(scope="module")
def server(
    base_checkpoint: Path, talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, shared_plans, media
):
    work = tmp_path_factory.mktemp("voice-serve")
    shared_plans.copy_to(talker_checkpoint, "cpu_x86_64", work / "artifacts" / "cpu_x86_64")
    # 20 uploads at once meet the store's limits, not the in-flight bound (test_request_guard.py has that one)
    extra = ["--speech-max-voices", "3", "--api-server-count", "2", "--speech-max-voice-uploads", "20"]
    # ref_audio URLs: the loopback media host only (named, so its private address is allowed), files under media/
    extra += ["--allowed-media-domains", "localhost", "--allowed-local-media-path", str(media.directory)]
    with running_server(base_checkpoint, work, "cpu_x86_64", extra) as server:
        yield server


def multipart(fields: dict, audio: bytes | None, field: str = "audio") -> tuple[bytes, str]:
    """A voice upload as multipart/form-data, the audio as the file ``field`` (ours: ``audio``; upstream's:
    ``audio_sample``): the body and its Content-Type."""
    boundary = "----voice-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    if audio is not None:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="ref.wav"\r\n'
        parts.append(head.encode() + b"Content-Type: audio/wav\r\n\r\n" + audio + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def upload(server, fields: dict, audio: bytes | None) -> tuple[int, dict]:
    """POST /v1/audio/voices as multipart/form-data."""
    body, kind = multipart(fields, audio)
    request = urllib.request.Request(server.url + "/v1/audio/voices", data=body, method="POST")
    request.add_header("Content-Type", kind)
    request.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_an_uploaded_voice_gives_the_frames_of_its_audio_sent_inline(server, clip, base_checkpoint):
    consent = "the espeak-ng voice, synthetic"
    status, made = upload(server, {"name": "alice", "ref_text": REFERENCE_TEXT, "consent": consent}, clip)
    assert status == 200 and made["success"], made
    made = made["voice"]
    assert made["mode"] == "in_context" and made["reference_frames"] == 100 and made["file_size"] == len(clip)
    assert made["mime_type"] == "audio/wav" and made["consent"] == consent and made["embedding_source"] == "audio"
    status, made = upload(server, {"name": "bob", "x_vector_only_mode": "true", "consent": consent}, clip)
    assert status == 200 and made["voice"]["mode"] == "x_vector"
    with server.request("/v1/audio/voices") as response:
        answer = json.loads(response.read())
    listed = {voice["name"]: voice for voice in answer["uploaded_voices"]}
    assert set(listed) == {"alice", "bob"} and listed["alice"]["ref_text"] == REFERENCE_TEXT
    assert answer["voices"] == ["alice", "bob", "default"]

    inline = base64.b64encode(clip).decode()
    by_name = server.codec_frames({**SAY, "voice": "alice"})
    assert len(by_name) == SAY["max_frames"]
    np.testing.assert_array_equal(
        by_name, server.codec_frames({**SAY, "ref_audio": inline, "ref_text": REFERENCE_TEXT})
    )
    data_url = f"data:audio/wav;base64,{inline}"
    x_vector = server.codec_frames({**SAY, "ref_audio": data_url, "x_vector_only_mode": True})
    np.testing.assert_array_equal(server.codec_frames({**SAY, "voice": "bob"}), x_vector)
    assert not np.array_equal(by_name, x_vector)

    from vllm_omni.entrypoints.voices.voice_store import VoiceStore
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    talker = Qwen3TTSConfig.from_pretrained(base_checkpoint).talker_config
    store = VoiceStore(server.artifacts / "voices", 8, 1 << 20, talker.hidden_size, 16, talker.codebook_size)
    kept = store.get("alice")  # what a restarted server reads back
    assert kept is not None and kept.consent == consent and len(kept.voice.reference_codes) == 100


def test_voice_uploads_and_cloning_requests_refused_with_reasons(server, clip):
    consent = {"consent": "synthetic"}
    for fields, audio, expected in (
        ({"name": "../../etc", **consent}, clip, (400, "a voice name is 1-64 letters")),
        ({"name": "carol", "ref_text": REFERENCE_TEXT}, clip, (400, "consent is required")),
        ({"name": "carol", **consent}, None, (400, "give one of audio_sample")),
        ({"name": "carol", **consent, "speaker_embedding": "[0.5, 1.5]"}, clip, (400, "give one of audio_sample")),
        ({"name": "carol", **consent, "speaker_embedding": "[0.5, 1.5]"}, None, (400, "speaker_embedding must be")),
        ({"name": "carol", **consent, "ref_text": "x"}, b"RIFF not really a wav", (400, "ref_audio: ")),
    ):
        status, answer = upload(server, fields, audio)
        assert (status, expected[1] in answer["error"]["message"]) == (expected[0], True), (fields, answer)
    for body, expected in (
        ({**SAY, "ref_audio": "https://example.com/me.wav", "ref_text": "x"}, "not among the allowed media domains"),
        ({**SAY, "ref_audio": "not base64!"}, "not base64"),
        ({**SAY, "ref_text": "words"}, "give the reference audio too"),
        ({**SAY, "speaker_embedding": [0.5, 1.5]}, "speaker_embedding must be"),
        ({**SAY, "voice": "nobody"}, "no preset speakers"),
        ({**SAY}, "clones a voice"),
    ):
        status, message = server.error(
            "/v1/audio/speech", {**body, "response_format": "codec", "edge_hardware": "cpu_x86_64"}
        )
        assert status == 400 and expected in message, message


def test_reference_audio_of_other_codecs_channels_or_rates_is_refused(server):
    from tests.audio_files import encoded

    fields = {"name": "carol", "x_vector_only_mode": "true", "consent": "synthetic"}
    for args, expected in (
        (("wav", "adpcm_ms", 24000, 1, 0.2), "coded as 'adpcm_ms'; reference audio takes PCM, FLAC, MP3"),
        (("flac", "flac", 384000, 8, 0.05), "have 8 channels; reference audio takes mono or stereo"),
        (("flac", "flac", 96000, 1, 0.1), "sampled at 96000 Hz; reference audio takes at most 48000 Hz"),
    ):
        status, answer = upload(server, fields, encoded(*args))
        assert status == 400 and expected in answer["error"]["message"], (args, answer)
    assert not (server.artifacts / "voices" / "carol.safetensors").exists()


def encodings_logged(server) -> int:
    return server.log.read_text(errors="replace").count("voice encoded in")


def test_clones_whose_clients_left_are_dropped_from_the_queue(server, clip):
    """50 uploads sent whole, their clients gone at once: the encodings that had not started never run (each
    API process runs at most the one it had started, and those that started before their client left)."""
    host, port = server.url.removeprefix("http://").split(":")
    body, kind = multipart({"name": "queued", "x_vector_only_mode": "true", "consent": "synthetic"}, clip)
    head = f"POST /v1/audio/voices HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
    head += f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    before = encodings_logged(server)
    clients = [socket.create_connection((host, int(port)), timeout=60) for _ in range(50)]
    for client in clients:
        client.sendall(head.encode() + body)
    for client in clients:
        client.close()
    time.sleep(5)  # every job either ran or was dropped by now (one encoding of the clip takes well under that)
    ran = encodings_logged(server) - before
    assert ran < 25, f"{ran} of 50 abandoned clones were encoded"
    with server.request("/health") as response:
        assert response.status == 200
    with contextlib.suppress(urllib.error.HTTPError), _delete(server, "queued"):
        pass


def test_hostile_uploads_leave_the_server_and_the_store_healthy(server, clip):
    host, port = server.url.removeprefix("http://").split(":")
    for path, kind in (
        ("/v1/audio/voices", "multipart/form-data; boundary=x"),
        ("/v1/audio/speech", "application/json"),
    ):
        with socket.create_connection((host, int(port)), timeout=60) as client:  # a 1 GB body, announced
            head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: {kind}\r\n"
            client.sendall(head.encode() + b"Content-Length: 1073741824\r\n\r\n" + b"x" * 65536)
            answer = client.recv(65536).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413"), answer[:300]
    status, _ = upload(server, {"name": "carol", "x_vector_only_mode": "true", "consent": "synthetic"}, clip)
    assert status == 200  # the third voice: the store holds 3 (--speech-max-voices 3)
    status, answer = upload(server, {"name": "dave", "x_vector_only_mode": "true", "consent": "synthetic"}, clip)
    assert status == 507 and "the voice store is full" in answer["error"]["message"]
    assert not (server.artifacts / "voices" / "dave.safetensors").exists()
    with _delete(server, "carol") as response:
        assert response.status == 200
    body = {
        "name": "dana",
        "audio": base64.b64encode(clip).decode(),
        "x_vector_only_mode": True,
        "consent": "synthetic",
    }
    with server.request("/v1/audio/voices", body) as response:  # JSON, the audio as base64
        assert response.status == 200 and json.loads(response.read())["voice"]["mode"] == "x_vector"
    with _delete(server, "dana") as response:
        assert response.status == 200
    voices = sorted(p.name for p in (server.artifacts / "voices").iterdir())
    assert voices == [".lock", "alice.safetensors", "bob.safetensors"]  # the store's lock, and no temporary left
    with server.request("/health") as response:
        assert response.status == 200


def test_a_cloned_voice_over_the_websocket(server, clip):
    """The start message names the uploaded voice (or carries the audio): each sentence speaks in it."""
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    start = {"type": "start", "language": "English", "greedy": True, "max_frames": 20, "edge_hardware": "cpu_x86_64"}
    inline = {"ref_audio": base64.b64encode(clip).decode(), "ref_text": REFERENCE_TEXT}
    expected = server.codec_frames({**SAY, "voice": "alice"})
    for voice in ({"voice": "alice"}, inline):
        received = []
        with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as client:
            for message in ({**start, **voice}, {"type": "text", "text": SAY["input"]}, {"type": "end"}):
                client.send(json.dumps(message))
            with contextlib.suppress(Exception):
                while True:
                    received.append(client.recv(timeout=120))
        assert client.close_code == 1000, client.close_reason
        frames = [e.frames for e in as_recording(received) if isinstance(e, FrameBatch) and len(e.frames)]
        np.testing.assert_array_equal(np.concatenate(frames), expected)


def test_a_cloned_voice_decodes_on_the_device_as_any_voice(server, base_checkpoint, tmp_path):
    """Edge unchanged: the device client asks for the uploaded voice by name and decodes the codec stream
    with the plan it downloads; its audio is the full decode of the frames the server sent."""
    say = ["--text", SAY["input"], "--voice", "alice", "--language", "English"]
    client_speaks_the_full_decode(server, base_checkpoint, tmp_path, say, {**SAY, "voice": "alice"}, 20)


def test_a_deleted_voice_is_gone(server):
    with _delete(server, "bob") as response:
        assert json.loads(response.read()) == {"success": True, "message": "Voice 'bob' deleted successfully"}
    with pytest.raises(urllib.error.HTTPError) as gone:
        _delete(server, "bob")
    assert gone.value.code == 404 and "no uploaded voice named 'bob'" in gone.value.read().decode()
    assert not (server.artifacts / "voices" / "bob.safetensors").exists()
    status, message = server.error("/v1/audio/speech", {**SAY, "voice": "bob", "response_format": "pcm"})
    assert status == 400 and "no preset speakers" in message


def test_uploads_of_one_name_replace_it_whole_and_the_limits_hold_across_api_servers(server, clip):
    """Uploads at the same moment, through both API server processes: of two of one name with different audio,
    both answer 200 and the voice kept speaks as one of them, whole (upstream's re-upload replaces; a request
    speaks the old or the new voice, never a mix); of 20 different names, only as many as the store has room
    for. Voice files are private."""
    directory = server.artifacts / "voices"
    kept = {p.name for p in directory.glob("*.safetensors")}  # alice, from the tests above
    x_vector = {"x_vector_only_mode": "true", "consent": "synthetic"}
    other = first_fifth_second("ref_b_22k.wav")
    inline = [
        server.codec_frames({**SAY, "ref_audio": base64.b64encode(audio).decode(), "x_vector_only_mode": True})
        for audio in (clip, other)
    ]
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda audio: upload(server, {"name": "frank", **x_vector}, audio), (clip, other)))
        assert [status for status, _ in answers] == [200, 200], answers
        spoken = server.codec_frames({**SAY, "voice": "frank"})
        assert any(np.array_equal(spoken, frames) for frames in inline)
        with _delete(server, "frank") as response:
            assert response.status == 200
        names = [f"crowd-{i:02d}" for i in range(20)]
        answers = list(pool.map(lambda name: upload(server, {"name": name, **x_vector}, clip), names))
    room = 3 - len(kept)  # --speech-max-voices 3
    assert sorted(status for status, _ in answers) == [200] * room + [507] * (20 - room), answers
    stored = {f"{name}.safetensors" for name, (status, _) in zip(names, answers, strict=True) if status == 200}
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert files == {name: 0o600 for name in {".lock", *kept, *stored}}  # no temporary left, none readable by others
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in stored:
        with _delete(server, name.removesuffix(".safetensors")) as response:
            assert response.status == 200


def test_a_voice_replaced_through_one_api_server_is_spoken_anew_by_the_other(server, clip):
    """``erin`` spoken through both API server processes, then uploaded again from other audio through one of them
    (replaced in place): both speak the new voice on their next request."""
    other = first_fifth_second("ref_b_22k.wav")
    inline = {
        audio: server.codec_frames({**SAY, "ref_audio": base64.b64encode(audio).decode(), "x_vector_only_mode": True})
        for audio in (clip, other)
    }
    assert not np.array_equal(inline[clip], inline[other])
    fields = {"name": "erin", "x_vector_only_mode": "true", "consent": "synthetic"}
    assert upload(server, fields, clip)[0] == 200
    for frames in _spoken_by_each_api_server(server, {**SAY, "voice": "erin"}).values():
        np.testing.assert_array_equal(frames, inline[clip])  # each process has read erin's first file
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)  # one connection: one process
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        body, kind = multipart(fields, other)  # uploaded again under its name: replaced, as upstream's
        connection.request("POST", "/v1/audio/voices", body, {**headers, "Content-Type": kind})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        replaced_by = _api_server_of(server, connection)
    finally:
        connection.close()
    spoken = _spoken_by_each_api_server(server, {**SAY, "voice": "erin"})
    assert replaced_by in spoken
    for frames in spoken.values():
        np.testing.assert_array_equal(frames, inline[other])  # the other process too: the new vectors
    with _delete(server, "erin") as response:
        assert response.status == 200


def _spoken_by_each_api_server(server, body: dict, attempts: int = 60) -> dict[int, np.ndarray]:
    """``body``'s codec frames as each API server process speaks them: requests on fresh connections until
    both processes have answered (the kernel spreads connections over them), every answer kept and compared."""
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps({**body, "response_format": "codec", "edge_hardware": "cpu_x86_64"})
    spoken: dict[int, np.ndarray] = {}
    for _ in range(attempts):
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
            connection.request("POST", "/v1/audio/speech", payload, headers)
            response = connection.getresponse()
            data = response.read()
            assert response.status == 200, data[:500]
            pid = _api_server_of(server, connection)
        finally:
            connection.close()
        batches = [e.frames for e in iter_events(io.BytesIO(data)) if isinstance(e, FrameBatch) and len(e.frames)]
        frames = np.concatenate(batches)
        if pid in spoken:
            np.testing.assert_array_equal(frames, spoken[pid])
        spoken[pid] = frames
        if len(spoken) == 2:
            return spoken
    pytest.fail(f"{attempts} connections all reached the API server process {list(spoken)}")


def _api_server_of(server, connection: http.client.HTTPConnection) -> int:
    """The pid of the server process holding the server end of ``connection`` (open: kept alive)."""
    import psutil

    client_port, server_port = connection.sock.getsockname()[1], int(server.url.rsplit(":", 1)[1])
    root = psutil.Process(server.process.pid)
    for process in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            for held in process.net_connections("tcp"):
                if held.raddr and held.raddr.port == client_port and held.laddr.port == server_port:
                    return process.pid
    raise AssertionError(f"no process of the server holds the connection from port {client_port}")


def _delete(server, name: str):
    request = urllib.request.Request(server.url + f"/v1/audio/voices/{name}", method="DELETE")
    request.add_header("Authorization", f"Bearer {KEY}")
    return urllib.request.urlopen(request, timeout=60)


# -- upstream vLLM-Omni's clients on a Base checkpoint ------------------------------------------------------------


def upstream_post(server, path: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_upstreams_openai_client_clones_from_every_kind_of_ref_audio(server, clip, media, base_checkpoint):
    """openai_speech_client.py with --task-type Base: voice (always sent, "vivian"), ref_audio as a data URL (a
    local file it reads), a file:// URL and an http URL on an allowed host, in-context and x-vector; the same
    audio gives the same speech whatever the form."""
    say = {"model": str(base_checkpoint), "input": SAY["input"], "voice": "vivian", "response_format": "wav"}
    say |= {"task_type": "Base", "language": "English", "max_new_tokens": 9, "extra_params": {"greedy": True}}
    data_url = f"data:audio/wav;base64,{base64.b64encode(clip).decode()}"
    urls = (data_url, (media.directory / "clip.wav").as_uri(), media.url + "/clip.wav", media.url + "/moved")
    for mode in ({"ref_text": REFERENCE_TEXT}, {"x_vector_only_mode": True}):
        answers = [upstream_post(server, "/v1/audio/speech", {**say, "ref_audio": url, **mode}) for url in urls]
        assert [status for status, _ in answers] == [200] * len(urls), answers[-1][1][:300]
        assert len({data for _, data in answers}) == 1
    # without task_type: ref_audio makes it Base (upstream's inference); a Base checkpoint's "default" is no voice
    inferred = {**say, "task_type": None, "voice": "default", "ref_audio": data_url, "ref_text": REFERENCE_TEXT}
    assert upstream_post(server, "/v1/audio/speech", inferred)[0] == 200
    refusals = (
        (media.url.replace("localhost", "127.0.0.1") + "/clip.wav", "not among the allowed media domains"),
        (media.url + "/elsewhere", "redirects to another host"),
        (media.url + "/nothing.wav", "could not be fetched"),
        ((media.directory.parent / "elsewhere.wav").as_uri(), "must lie under the server's --allowed-local-media"),
        ("ftp://127.0.0.1/clip.wav", "ftp:// is not fetched"),
    )
    for url, words in refusals:
        status, data = upstream_post(server, "/v1/audio/speech", {**say, "ref_audio": url, "ref_text": REFERENCE_TEXT})
        assert status == 400 and words in json.loads(data)["error"]["message"], (url, data[:300])
    with server.request("/health") as response:
        assert response.status == 200


def test_upstreams_batch_client_clones_one_voice_for_every_item(server, clip, base_checkpoint):
    data_url = f"data:audio/wav;base64,{base64.b64encode(clip).decode()}"
    body = {"items": [{"input": "One."}, {"input": "Two, and three."}], "response_format": "wav", "voice": "vivian"}
    body |= {"task_type": "Base", "ref_audio": data_url, "ref_text": REFERENCE_TEXT, "max_new_tokens": 5}
    status, data = upstream_post(server, "/v1/audio/speech/batch", body)
    answer = json.loads(data)
    assert status == 200 and answer["succeeded"] == 2, answer
    assert all(r["usage"]["input_token_details"]["audio_tokens"] == 100 for r in answer["results"])  # in context


def test_upstreams_voices_round_trip(server, clip, base_checkpoint):
    """Upload (multipart audio_sample, consent, name, ref_text, speaker_description), list, speak, upload again
    (replaced), an embedding upload, delete: upstream's shapes throughout."""
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    fields = {"consent": "synthetic", "name": "gina", "ref_text": REFERENCE_TEXT, "speaker_description": "calm"}
    body, kind = multipart(fields, clip, field="audio_sample")
    request = urllib.request.Request(server.url + "/v1/audio/voices", data=body, method="POST")
    request.add_header("Content-Type", kind)
    request.add_header("Authorization", f"Bearer {KEY}")
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert response.status == 200 and answer["success"] is True
    assert {k: answer["voice"][k] for k in ("name", "consent", "ref_text", "speaker_description")} == fields
    with server.request("/v1/audio/voices") as response:
        listed = json.loads(response.read())
    assert "gina" in listed["voices"] and "default" in listed["voices"]
    assert next(v for v in listed["uploaded_voices"] if v["name"] == "gina")["speaker_description"] == "calm"
    say = {"input": SAY["input"], "voice": "gina", "response_format": "pcm", "max_new_tokens": 5}
    assert upstream_post(server, "/v1/audio/speech", say)[0] == 200
    hidden = Qwen3TTSConfig.from_pretrained(base_checkpoint).talker_config.hidden_size
    embedding = json.dumps([0.01 * i for i in range(hidden)])
    status, answer = upload(server, {"consent": "synthetic", "name": "gina", "speaker_embedding": embedding}, None)
    assert status == 200 and answer["voice"]["embedding_source"] == "direct"
    assert answer["voice"]["embedding_dim"] == hidden and answer["voice"]["mode"] == "x_vector"
    with _delete(server, "gina") as response:
        assert json.loads(response.read()) == {"success": True, "message": "Voice 'gina' deleted successfully"}


def test_upstream_websocket_clones_a_voice_per_session(server, clip):
    """streaming_speech_client.py with --task-type Base --ref-audio URL --ref-text: two utterances, one voice."""
    from websockets.sync.client import connect

    config = {"type": "session.config", "speaker": "Vivian", "task_type": "Base", "language": "English"}
    config |= {"response_format": "pcm", "speed": 1.0, "max_new_tokens": 6, "greedy": True}
    config |= {"ref_audio": f"data:audio/wav;base64,{base64.b64encode(clip).decode()}", "ref_text": REFERENCE_TEXT}
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    heard = []
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        socket.send(json.dumps(config))
        for text in ("One.", "Two."):
            socket.send(json.dumps({"type": "input.text", "text": text}))
            socket.send(json.dumps({"type": "input.done"}))
            while True:
                message = socket.recv(timeout=120)
                if isinstance(message, bytes):
                    heard.append(message)
                elif json.loads(message)["type"] == "session.done":
                    break
        socket.send(json.dumps({"type": "session.close"}))
    assert len(heard) == 2
    body = {k: v for k, v in config.items() if k not in ("type", "speaker")}
    assert heard[0] == upstream_post(server, "/v1/audio/speech", {**body, "input": "One."})[1]


# Spellings of this machine's addresses that are not the named media host (localhost).
LOCAL_SPELLINGS = ["１２７.０.０.１", "127。0。0。1", "127.0.0.1", "127.0.0.1.", "127.0.0.2", "0.0.0.0", "2130706433"]
LOCAL_SPELLINGS += ["[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[64:ff9b::7f00:1]"]


def upstream_socket_config(server, config: dict) -> list:
    """Upstream's WebSocket: ``config``, then ``input.text`` and ``input.done``; the messages received until
    ``session.done`` or the close."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    received = []
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=60) as socket:
        for message in (config, {"type": "input.text", "text": "Hi."}, {"type": "input.done"}):
            socket.send(json.dumps(message))
        try:
            while True:
                received.append(json.loads(socket.recv(timeout=60)))
                if received[-1]["type"] == "session.done":
                    break
        except ConnectionClosed:
            pass
    return received


def refused_as_not_allowed(message: str) -> bool:
    """A refusal of the address rule (``tests/entrypoints/generation/test_egress.py`` checks it at the socket, with
    no allow-list) or, on this server, of its allow-list (``localhost`` only), which comes first."""
    return "not a public address" in message or "not among the allowed media domains (localhost;" in message


def test_ref_audio_at_any_spelling_of_this_machine_reaches_no_listener_on_any_route(server, clip):
    """The speech route, the batch, a voice upload and the WebSocket's config: every spelling refused, and the
    listener on every local address counts no connection."""
    from ..listeners import CountingListener

    listener = CountingListener()
    try:
        for host in LOCAL_SPELLINGS:
            url = f"http://{host}:{listener.port}/ref.wav"
            reference = {"ref_audio": url, "ref_text": REFERENCE_TEXT, "task_type": "Base"}
            status, data = upstream_post(server, "/v1/audio/speech", {**SAY, **reference})
            assert status == 400 and refused_as_not_allowed(json.loads(data)["error"]["message"]), (host, data)
            batch = {"items": [{"input": "One."}], "response_format": "wav", **reference, "max_new_tokens": 4}
            status, data = upstream_post(server, "/v1/audio/speech/batch", batch)
            assert status == 200 and refused_as_not_allowed(json.loads(data)["results"][0]["error"]), (host, data)
            upload_body = {"name": "mallory", "consent": "synthetic", "audio_sample": url, "ref_text": "x"}
            status, data = upstream_post(server, "/v1/audio/voices", upload_body)
            assert status == 400 and refused_as_not_allowed(json.loads(data)["error"]["message"]), (host, data)
            config = {"type": "session.config", "response_format": "pcm", "max_new_tokens": 4, **reference}
            errors = [m["message"] for m in upstream_socket_config(server, config) if m["type"] == "error"]
            assert errors and all(refused_as_not_allowed(e) for e in errors), (host, errors)
    finally:
        listener.close()
    assert listener.accepted == 0
    with server.request("/health") as response:
        assert response.status == 200


def test_no_refusal_quotes_a_fetched_or_local_file_or_a_server_path(server, media, base_checkpoint):
    reference = {"ref_text": REFERENCE_TEXT, "task_type": "Base"}
    sources = [media.url + "/marker", (media.directory / "marker.wav").as_uri()]
    sources += [(media.directory / "missing.wav").as_uri(), (media.directory.parent / "outside.wav").as_uri()]
    answers = []
    for url in sources:
        answers.append(upstream_post(server, "/v1/audio/speech", {**SAY, **reference, "ref_audio": url}))
        upload_body = {"name": "mallory", "consent": "synthetic", "audio_sample": url, "ref_text": "x"}
        answers.append(upstream_post(server, "/v1/audio/voices", upload_body))
        answers.append(upstream_post(server, "/v1/audio/speech/batch", {"items": [{"input": "One."}], **reference,
                                                                         "ref_audio": url}))  # fmt: skip
    for status, data in answers:
        assert status in (200, 400), data[:300]
        assert MARKER not in data and b"PLANTED" not in data, data[:300]
        for path in (media.directory, base_checkpoint):
            assert str(path).encode() not in data and str(path.resolve()).encode() not in data, data[:300]
    assert b"not an accepted audio file" in answers[0][1] and b"not an accepted audio file" in answers[3][1]


def test_metrics_need_the_key_and_name_the_served_model_not_its_path(server, base_checkpoint):
    status, message = server.error("/metrics", key=None)
    assert status == 401 and "--speech-open-metrics" in message
    assert server.error("/metrics", key="wrong")[0] == 401
    with server.request("/metrics") as response:
        body = response.read().decode()
    assert "vllm:num_requests_running" in body
    assert str(base_checkpoint) not in body and str(base_checkpoint.resolve()) not in body
    assert f'model_name="{base_checkpoint.name}"' in body
