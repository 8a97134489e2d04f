"""Upstream vLLM-Omni's request fields with upstream's meaning, and reference audio fetched under vLLM's media rules.

No server here: the body as the routes read it (:func:`speech_body`), against the configs of the three checkpoint
kinds, and :func:`fetch_reference` against a local HTTP server. The served routes: ``test_serve.py``,
``test_voice_serve.py``.
"""

from __future__ import annotations

import asyncio
import http.server
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_omni.entrypoints.generation.reference_fetch import MediaRules, ReferenceFetchError, fetch_reference
from vllm_omni.entrypoints.openai.speech_api import (
    ReferenceUrl,
    SpeechApiError,
    decode_audio_field,
    speech_body,
    speech_body_model,
)
from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits

pytestmark = pytest.mark.vllm

SPEAKERS = ["serena", "vivian", "ryan"]
MODEL = speech_body_model()


def checkpoint(kind: str, speakers: list[str] = SPEAKERS):
    return SimpleNamespace(tts_model_type=kind, supported_speakers=speakers if kind == "custom_voice" else [])


def body(fields: dict, kind: str = "custom_voice", speakers: list[str] = SPEAKERS):
    return speech_body(MODEL, fields, SpeechLimits(), ("qwen3-tts",), checkpoint(kind, speakers))


def refused(fields: dict, kind: str = "custom_voice") -> tuple[int, str]:
    with pytest.raises(SpeechApiError) as info:
        body(fields, kind)
    return info.value.status, str(info.value)


@pytest.mark.parametrize(
    ("fields", "voice"),
    [
        ({"input": "Hi."}, "vivian"),  # upstream's default voice
        ({"input": "Hi.", "voice": "default"}, "vivian"),
        ({"input": "Hi.", "voice": "DEFAULT"}, "vivian"),
        ({"input": "Hi.", "speaker": "Ryan"}, "Ryan"),  # upstream's alias
        ({"input": "Hi.", "voice": {"id": "ryan"}}, "ryan"),  # OpenAI's voice object
        ({"input": "Hi.", "speaker": {"id": "serena"}}, "serena"),
    ],
)
def test_custom_voice_takes_every_form_of_voice(fields, voice):
    assert body(fields).voice == voice


def test_a_checkpoint_without_upstreams_default_speaker_speaks_its_first():
    assert body({"input": "Hi."}, speakers=["aiden", "ryan"]).voice == "aiden"


def test_a_voice_beside_what_gives_the_voice_is_dropped_as_upstream_does():
    # upstream's client always sends one: VoiceDesign's instruction and Base's reference give the voice there.
    design = body({"input": "Hi.", "voice": "vivian", "instructions": "A calm voice."}, "voice_design")
    assert design.voice is None and design.instructions == "A calm voice."
    clone = body(
        {"input": "Hi.", "voice": "vivian", "ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "x"}, "base"
    )
    assert clone.voice is None
    embedded = body({"input": "Hi.", "voice": "vivian", "speaker_embedding": [0.0, 1.0]}, "base")
    assert embedded.voice is None
    assert body({"input": "Hi.", "voice": "alice"}, "base").voice == "alice"  # an uploaded voice's name


def test_task_type_is_inferred_from_the_reference_and_checked():
    assert body({"input": "Hi.", "ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "x"}, "base").task_type is None
    status, message = refused({"input": "Hi.", "ref_text": "the transcript"})
    assert status == 400 and "task_type Base (inferred from ref_audio/ref_text)" in message
    status, message = refused({"input": "Hi.", "task_type": "VoiceDesign"})
    assert status == 400 and "does not match the served model (CustomVoice): send task_type CustomVoice" in message


def test_max_new_tokens_caps_the_talker_steps():
    from vllm_omni.entrypoints.openai.speech_api import to_speech_request

    request = to_speech_request(body({"input": "Hi.", "max_new_tokens": 10}))
    assert (request.max_new_tokens, request.max_frames) == (10, None)  # a cap within the engine's room
    assert to_speech_request(body({"input": "Hi."})).max_new_tokens is None
    for value in (0, 4097):
        status, message = refused({"input": "Hi.", "max_new_tokens": value})
        assert status == 400 and "max_new_tokens" in message
    status, message = refused({"input": "Hi.", "max_new_tokens": 10, "max_frames": 5})
    assert status == 400 and "not both" in message


def test_fields_upstream_has_and_this_server_cannot_honour_are_refused_not_ignored():
    status, message = refused({"input": "Hi.", "word_timestamps": True})
    assert status == 400 and "forced-aligner" in message
    assert body({"input": "Hi.", "word_timestamps": False}).word_timestamps is False


def test_extra_params_set_sampling_and_nothing_else():
    extra = body({"input": "Hi.", "extra_params": {"temperature": 0.5, "top_k": 7, "seed": 3}})
    assert (extra.temperature, extra.top_k, extra.seed, extra.extra_params) == (0.5, 7, 3, None)
    status, message = refused({"input": "Hi.", "extra_params": {"speaker_id": 1}})
    assert status == 400 and "extra_params.speaker_id is not taken here" in message
    status, message = refused({"input": "Hi.", "extra_params": {"top_p": "high"}})
    assert status == 400 and message.startswith("extra_params: top_p")
    status, message = refused({"input": "Hi.", "temperature": 0.9, "extra_params": {"temperature": 0.5}})
    assert status == 400 and "given twice" in message


def test_stream_alone_means_server_sent_events_as_upstream():
    assert body({"input": "Hi.", "stream": True}).sse
    assert body({"input": "Hi.", "stream_format": "sse"}).sse
    raw = body({"input": "Hi.", "stream": True, "stream_format": "audio"})  # the Gradio demo's gapless stream
    assert not raw.sse and raw.streamed
    plain = body({"input": "Hi."})
    assert not plain.sse and not plain.streamed and plain.response_format == "mp3"  # OpenAI's default stays


def test_initial_codec_chunk_frames_sets_the_first_chunk():
    assert body({"input": "Hi."}).first_frames == 1
    assert body({"input": "Hi.", "initial_codec_chunk_frames": 0}).first_frames == 1
    assert body({"input": "Hi.", "initial_codec_chunk_frames": 8}).first_frames == 8
    assert refused({"input": "Hi.", "initial_codec_chunk_frames": -1})[0] == 400


def test_reference_audio_forms():
    assert decode_audio_field("data:audio/wav;base64,AAAA") == b"\0\0\0"
    assert decode_audio_field("AA AA\n") == b"\0\0\0"
    for url in ("http://127.0.0.1:9/a.wav", "HTTPS://example.com/a.wav", "file:///srv/a.wav"):
        assert isinstance(decode_audio_field(url), ReferenceUrl)
    with pytest.raises(SpeechApiError, match="ftp:// is not fetched"):
        decode_audio_field("ftp://example.com/a.wav")


class _Files(http.server.BaseHTTPRequestHandler):
    """``/audio`` answers 4 KB; ``/same`` redirects to ``/audio``; ``/elsewhere`` to another host; ``/big`` is
    over the limit the tests set."""

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/same":
            self.send_response(302)
            self.send_header("Location", "/audio")
        elif self.path == "/elsewhere":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/audio")
        elif self.path in ("/audio", "/big"):
            data = b"R" * (4096 if self.path == "/audio" else 100_000)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetch(url: str, **rules) -> bytes:
    return asyncio.run(fetch_reference(url, MediaRules(**{"max_bytes": 50_000, **rules})))


def test_a_loopback_url_is_fetched_only_from_a_host_the_operator_named(files_url):
    allowed = {"allowed_domains": ("127.0.0.1",)}
    assert fetch(files_url + "/audio", **allowed) == b"R" * 4096
    assert fetch(files_url + "/same", **allowed) == b"R" * 4096  # a redirect within the host
    with pytest.raises(ReferenceFetchError, match="private, loopback or link-local"):
        fetch(files_url + "/audio")  # no allow-list: public addresses only
    with pytest.raises(ReferenceFetchError, match="not among the allowed media domains"):
        fetch(files_url.replace("127.0.0.1", "localhost") + "/audio", **allowed)
    with pytest.raises(ReferenceFetchError, match="redirects to another host"):
        fetch(files_url + "/elsewhere", allowed_domains=("127.0.0.1", "localhost"))
    with pytest.raises(ReferenceFetchError, match="larger than the 50000 bytes"):
        fetch(files_url + "/big", **allowed)
    with pytest.raises(ReferenceFetchError, match="could not be fetched"):  # the upstream's status is not quoted
        fetch(files_url + "/nothing", **allowed)
    with pytest.raises(ReferenceFetchError, match="redirects, and VLLM_MEDIA_URL_ALLOW_REDIRECTS is off"):
        fetch(files_url + "/same", follow_redirects=False, **allowed)


def test_a_name_that_resolves_to_a_private_address_is_refused_by_the_resolver_the_connection_uses(files_url):
    with pytest.raises(ReferenceFetchError, match="localhost is not a public address"):
        fetch(files_url.replace("127.0.0.1", "localhost") + "/audio")
    with pytest.raises(ReferenceFetchError, match="private"):
        fetch("http://[::ffff:127.0.0.1]:9/audio")


def test_file_urls_need_the_allowed_local_media_path(tmp_path: Path):
    root, outside = tmp_path / "media", tmp_path / "secret.wav"
    root.mkdir()
    (root / "ref.wav").write_bytes(b"W" * 100)
    outside.write_bytes(b"S")
    (root / "link.wav").symlink_to(outside)
    assert fetch((root / "ref.wav").as_uri(), local_root=root.resolve()) == b"W" * 100
    with pytest.raises(ReferenceFetchError, match="--allowed-local-media-path"):
        fetch((root / "ref.wav").as_uri())
    for path in (outside, root / "link.wav", root / ".." / "secret.wav"):
        with pytest.raises(ReferenceFetchError, match="must lie under"):
            fetch(path.as_uri(), local_root=root.resolve())
    with pytest.raises(ReferenceFetchError, match="larger than the 10 bytes"):
        fetch((root / "ref.wav").as_uri(), local_root=root.resolve(), max_bytes=10)
