"""``POST /v1/audio/voices``: a voice to clone uploaded, checked, encoded once and handed to the store.

The HTTP side of voice cloning (the body, JSON or multipart, and its checks); the files themselves are the
store's (:mod:`..voices.voice_store`), which knows no HTTP. The route is mounted by :mod:`.edge_routes`.
"""

from __future__ import annotations

from typing import Any

from ..openai.speech_api import SpeechApiError, check_text, decode_audio_field, parse_json
from ..openai.speech_http import read_body
from ..server.edge_state import EdgeServingState
from ..voices.voice_store import StoredVoice, check_name


async def save_voice(request: Any, edge: EdgeServingState) -> StoredVoice:
    """``POST /v1/audio/voices``: the upload (JSON or multipart) checked, encoded on the voice pool, stored.

    Fields: ``name``; ``audio`` (JSON: base64 or a data URL; multipart: a file); ``ref_text`` (in-context
    cloning) or ``x_vector_only_mode``; ``consent`` (required: who agreed to have this voice cloned).
    """
    from ..generation.speech import SpeechRequest  # needs transformers (the serving venv): imported when used

    store = edge.uploads()
    limit = edge.limits.max_body_bytes
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            raise SpeechApiError(413, f"a multipart voice upload needs a Content-Length of at most {limit} bytes")
        try:
            form = await request.form(max_files=1, max_fields=8)
        except Exception as error:  # starlette's multipart errors (malformed, too many parts)
            raise SpeechApiError(400, f"the multipart body does not parse: {getattr(error, 'detail', error)}") from None
        try:
            fields = dict(form.items())
            upload = fields.get("audio")
            audio = await upload.read() if hasattr(upload, "read") else None
            if isinstance(upload, str):
                audio = decode_audio_field(upload, "audio")
        finally:
            await form.close()
    else:
        fields = parse_json(await read_body(request, limit))
        if not isinstance(fields, dict):
            raise SpeechApiError(400, "a voice upload is one JSON object: name, audio, ref_text, consent")
        audio = decode_audio_field(fields["audio"], "audio") if isinstance(fields.get("audio"), str) else None
    name = check_name(fields.get("name"))
    if not audio:
        raise SpeechApiError(400, "audio is required: the reference recording (a WAV, FLAC, MP3 or OGG file)")
    consent = fields.get("consent")
    if not isinstance(consent, str) or not consent.strip():
        raise SpeechApiError(
            400, "consent is required: say who agreed to have this voice cloned (e.g. the speaker's name and date)"
        )
    check_text("consent", consent, 1024)
    ref_text = fields.get("ref_text") or None
    if ref_text is not None and not isinstance(ref_text, str):
        raise SpeechApiError(400, "ref_text must be a string, the transcript of the audio")
    check_text("ref_text", ref_text, edge.limits.max_input_chars, "speech-max-input-chars")
    x_vector_only = str(fields.get("x_vector_only_mode", "false")).lower() in ("true", "1")
    await edge.voice_files(store.check_room, name)  # before the encoding's CPU time
    request_voice = SpeechRequest(text="Hello.", ref_audio=audio, ref_text=ref_text, x_vector_only_mode=x_vector_only)
    voice = await edge.encode_voice(request_voice)
    # A voice must leave room for text: its prompt is built once here, as a request would build it.
    await edge.prepare(SpeechRequest(text="Hello.", voice=voice), f"voice-check-{name}")
    return await edge.voice_files(store.save, name, voice, consent.strip())
