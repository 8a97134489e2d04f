"""A Base checkpoint served: voices uploaded once and used by name, and the cloned voice decoded on a device.

``vllm serve`` on a random-weight Base checkpoint whose speech tokenizer is the serving tests' (so their
CPU plan serves it too). Its decoder geometry makes 500 frames per second of reference audio, so the
reference is a 0.2 s clip of an espeak-ng recording (100 frames): the engine's 512 positions hold it.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
import socket
import urllib.error
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.stream import FrameBatch

from .serving import KEY, as_recording, client_speaks_the_full_decode, running_server

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "voices"
REFERENCE_TEXT = "The quick"
SAY = {"input": "Hello from a cloned voice.", "language": "English", "greedy": True, "max_frames": 20}


@pytest.fixture(scope="module")
def clip() -> bytes:
    """The first 0.2 s of ref_a (22.05 kHz WAV bytes)."""
    with wave.open(str(FIXTURES / "ref_a_22k.wav")) as handle:
        rate, frames = handle.getframerate(), handle.readframes(handle.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(rate)
        handle.writeframes(frames[: int(0.2 * rate) * 2])
    return out.getvalue()


@pytest.fixture(scope="module")
def base_checkpoint(talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Base talker beside the serving tests' speech tokenizer (the same bytes, so the same plans)."""
    from vllm_omni.edge.testing.talker_checkpoint import write_talker_files

    out = tmp_path_factory.mktemp("base-serve") / "ckpt"
    shutil.copytree(talker_checkpoint / "speech_tokenizer", out / "speech_tokenizer")
    return write_talker_files(out, "tiny", seed=3, model_type="base")


@pytest.fixture(scope="module")
def server(base_checkpoint: Path, talker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, shared_plans):
    work = tmp_path_factory.mktemp("voice-serve")
    shared_plans.copy_to(talker_checkpoint, "cpu_x86_64", work / "artifacts" / "cpu_x86_64")
    with running_server(base_checkpoint, work, "cpu_x86_64", ["--speech-max-voices", "3"]) as server:
        yield server


def upload(server, fields: dict, audio: bytes | None) -> tuple[int, dict]:
    """POST /v1/audio/voices as multipart/form-data."""
    boundary = "----voice-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    if audio is not None:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="ref.wav"\r\n'
        parts.append(head.encode() + b"Content-Type: audio/wav\r\n\r\n" + audio + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    request = urllib.request.Request(server.url + "/v1/audio/voices", data=body, method="POST")
    request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    request.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_an_uploaded_voice_gives_the_frames_of_its_audio_sent_inline(server, clip, base_checkpoint):
    consent = "the espeak-ng voice, synthetic"
    status, made = upload(server, {"name": "alice", "ref_text": REFERENCE_TEXT, "consent": consent}, clip)
    assert status == 201 and made["mode"] == "in_context" and made["reference_frames"] == 100, made
    status, made = upload(server, {"name": "bob", "x_vector_only_mode": "true", "consent": consent}, clip)
    assert status == 201 and made["mode"] == "x_vector"
    with server.request("/v1/audio/voices") as response:
        listed = {voice["name"]: voice for voice in json.loads(response.read())["voices"]}
    assert set(listed) == {"alice", "bob"} and listed["alice"]["ref_text"] == REFERENCE_TEXT

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

    from vllm_omni.entrypoints.voice_store import VoiceStore
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    talker = Qwen3TTSConfig.from_pretrained(base_checkpoint).talker_config
    store = VoiceStore(server.artifacts / "voices", 8, 1 << 20, talker.hidden_size, 16, talker.codebook_size)
    kept = store.get("alice")  # what a restarted server reads back
    assert kept is not None and kept.consent == consent and len(kept.voice.reference_codes) == 100


def test_voice_uploads_and_cloning_requests_refused_with_reasons(server, clip):
    consent = {"consent": "synthetic"}
    for fields, audio, expected in (
        ({"name": "alice", **consent, "ref_text": REFERENCE_TEXT}, clip, (409, "exists")),
        ({"name": "../../etc", **consent}, clip, (400, "a voice name is 1-64 letters")),
        ({"name": "carol", "ref_text": REFERENCE_TEXT}, clip, (400, "consent is required")),
        ({"name": "carol", **consent}, None, (400, "audio is required")),
        ({"name": "carol", **consent}, clip, (400, "needs ref_text")),
        ({"name": "carol", **consent, "ref_text": "x"}, b"RIFF not really a wav", (400, "ref_audio: ")),
    ):
        status, answer = upload(server, fields, audio)
        assert (status, expected[1] in answer["error"]["message"]) == (expected[0], True), (fields, answer)
    for body, expected in (
        ({**SAY, "ref_audio": "https://example.com/me.wav", "ref_text": "x"}, "does not fetch URLs"),
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


def test_hostile_uploads_leave_the_server_and_the_store_healthy(server, clip):
    host, port = server.url.removeprefix("http://").split(":")
    for path, kind in (
        ("/v1/audio/voices", "multipart/form-data; boundary=x"),
        ("/v1/audio/speech", "application/json"),
    ):
        with socket.create_connection((host, int(port)), timeout=60) as client:  # a 1 GB body, announced
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: {kind}\r\n"
            client.sendall(head.encode() + b"Content-Length: 1073741824\r\n\r\n" + b"x" * 65536)
            answer = client.recv(65536).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413"), answer[:300]
    status, _ = upload(server, {"name": "carol", "x_vector_only_mode": "true", "consent": "synthetic"}, clip)
    assert status == 201  # the third voice: the store holds 3 (--speech-max-voices 3)
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
        assert response.status == 201 and json.loads(response.read())["mode"] == "x_vector"
    with _delete(server, "dana") as response:
        assert response.status == 200
    assert sorted(p.name for p in (server.artifacts / "voices").iterdir()) == ["alice.safetensors", "bob.safetensors"]
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
        assert json.loads(response.read()) == {"deleted": "bob"}
    assert not (server.artifacts / "voices" / "bob.safetensors").exists()
    status, message = server.error("/v1/audio/speech", {**SAY, "voice": "bob", "response_format": "pcm"})
    assert status == 400 and "no preset speakers" in message


def _delete(server, name: str):
    request = urllib.request.Request(server.url + f"/v1/audio/voices/{name}", method="DELETE")
    request.add_header("Authorization", f"Bearer {KEY}")
    return urllib.request.urlopen(request, timeout=60)
