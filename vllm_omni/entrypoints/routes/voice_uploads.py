"""``POST /v1/audio/voices``: a voice to clone uploaded, checked, encoded once and handed to the store.

The HTTP side of voice cloning (the body, JSON or multipart, and its checks); the files themselves are the
store's (:mod:`..voices.voice_store`), which knows no HTTP. The route is mounted by :mod:`.edge_routes`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..openai.speech_api import ReferenceUrl, SpeechApiError, check_text, decode_audio_field, parse_json
from ..openai.speech_http import BODY_SECONDS, read_body
from ..server.speech_service import SpeechService
from ..voices.voice_store import StoredVoice, check_name


@dataclass(frozen=True)
class VoiceUpload:
    """A checked upload, not encoded yet: the voice's ``name``, the request that makes it, its ``consent`` and the
    details the store lists."""

    name: str
    voice_request: Any  # a SpeechRequest with the reference (or embedding) to encode
    consent: str
    details: dict[str, Any]


async def read_voice_upload(request: Any, speech: SpeechService) -> VoiceUpload:
    """``POST /v1/audio/voices``'s body (multipart as upstream vLLM-Omni's clients send it, or JSON), read within
    :data:`~..openai.speech_http.BODY_SECONDS` and checked; :func:`save_voice` then encodes and stores it.

    Fields: ``name``; ``audio_sample`` (upstream's name; ours: ``audio``; multipart: a file, JSON: base64 or a
    data URL) or ``speaker_embedding`` (a JSON list of the talker's hidden size: an x-vector voice); ``ref_text``
    (in-context cloning; without it the voice is x-vector only, as upstream's) or ``x_vector_only_mode``;
    ``speaker_description`` (kept, listed); ``consent`` (required: who agreed to have this voice cloned).
    """
    from ..generation.speech import SpeechRequest  # needs transformers (the serving venv): imported when used

    store = speech.voices.uploads()
    limit = speech.limits.max_body_bytes
    kind = request.headers.get("content-type", "")
    mime_type = None
    if kind.lower().startswith("multipart/form-data"):  # media types are case-insensitive (the guard's check too)
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            raise SpeechApiError(413, f"a multipart voice upload needs a Content-Length of at most {limit} bytes")
        try:
            async with asyncio.timeout(BODY_SECONDS):  # a body trickled in byte by byte holds nothing for long
                form = await request.form(max_files=1, max_fields=8)
        except TimeoutError:
            raise SpeechApiError(408, f"the body did not arrive within {BODY_SECONDS:g} s") from None
        except Exception as error:  # starlette's multipart errors (malformed, too many parts)
            raise SpeechApiError(400, f"the multipart body does not parse: {getattr(error, 'detail', error)}") from None
        try:
            fields = dict(form.items())
            upload = fields.get("audio_sample", fields.get("audio"))
            audio = await upload.read() if hasattr(upload, "read") else None
            mime_type = getattr(upload, "content_type", None)
            if isinstance(upload, str):
                audio = decode_audio_field(upload, "audio_sample")
        finally:
            await form.close()
    else:
        fields = parse_json(await read_body(request, limit))
        if not isinstance(fields, dict):
            raise SpeechApiError(400, "a voice upload is one JSON object: name, audio_sample, ref_text, consent")
        given = fields.get("audio_sample", fields.get("audio"))
        audio = decode_audio_field(given, "audio_sample") if isinstance(given, str) else None
    name = check_name(fields.get("name"))
    embedding = fields.get("speaker_embedding")
    if isinstance(embedding, str):
        embedding = parse_json(embedding, "speaker_embedding")
    if (audio is None) == (embedding is None):
        raise SpeechApiError(
            400,
            "give one of audio_sample (the reference recording: a WAV, FLAC, MP3 or OGG file) or speaker_embedding "
            "(a JSON list of numbers)",
        )
    consent = fields.get("consent")
    if not isinstance(consent, str) or not consent.strip():
        raise SpeechApiError(
            400, "consent is required: say who agreed to have this voice cloned (e.g. the speaker's name and date)"
        )
    check_text("consent", consent, 1024)
    ref_text = fields.get("ref_text") or None
    if ref_text is not None and not isinstance(ref_text, str):
        raise SpeechApiError(400, "ref_text must be a string, the transcript of the audio")
    check_text("ref_text", ref_text, speech.limits.max_input_chars, "speech-max-input-chars")
    description = fields.get("speaker_description") or None
    if description is not None and not isinstance(description, str):
        raise SpeechApiError(400, "speaker_description must be a string")
    check_text("speaker_description", description, 1024)
    x_vector_only = ref_text is None or str(fields.get("x_vector_only_mode", "false")).lower() in ("true", "1")
    await speech.voices.files(store.check_room, name)  # before any fetch and the encoding's CPU time
    if isinstance(audio, ReferenceUrl):
        audio = await speech.fetch_reference(audio)
    details = {"speaker_description": description, "embedding_source": "audio" if audio else "direct"}
    if audio:
        given_type = mime_type if mime_type not in (None, "", "application/octet-stream") else None
        details |= {"file_size": len(audio), "mime_type": given_type or sniff_mime_type(audio)}
    if embedding is not None:
        request_voice = SpeechRequest(text="Hello.", speaker_embedding=embedding)
    else:
        cloned = {"ref_audio": audio, "ref_text": ref_text, "x_vector_only_mode": x_vector_only}
        request_voice = SpeechRequest(text="Hello.", **cloned)
    return VoiceUpload(name, request_voice, consent.strip(), details)


async def save_voice(upload: VoiceUpload, speech: SpeechService) -> StoredVoice:
    """``upload`` encoded on the voice pool (bounded: a 503 when full) and stored, replacing a voice of its name."""
    from ..generation.speech import SpeechRequest

    voice = await speech.encode_voice(upload.voice_request)
    # A voice must leave room for text: its prompt is built once here, as a request would build it.
    await speech.prepare(SpeechRequest(text="Hello.", voice=voice), f"voice-check-{upload.name}")
    store = speech.voices.uploads()
    return await speech.voices.files(store.save, upload.name, voice, upload.consent, upload.details)


def sniff_mime_type(audio: bytes) -> str:
    """The media type of an audio file sent without one (JSON uploads), from its first bytes."""
    if audio[:4] == b"RIFF":
        return "audio/wav"
    if audio[:4] == b"fLaC":
        return "audio/flac"
    if audio[:4] == b"OggS":
        return "audio/ogg"
    if audio[:3] == b"ID3" or audio[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    return "application/octet-stream"
