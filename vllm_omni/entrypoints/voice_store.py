"""Uploaded voices of a Base checkpoint, encoded once and kept on disk: ``POST/GET/DELETE /v1/audio/voices``.

A voice is one safetensors file under the server's artifacts directory (``voices/NAME.safetensors``):
``speaker_embedding`` (float32) and, for in-context cloning, ``reference_codes`` (int64 ``[T, 16]``),
with its transcript, mode and consent in the metadata. Later requests name it as ``voice`` and nothing
is encoded again; a restart reads the directory back. Names are checked against :data:`NAME_PATTERN`
before anything touches the filesystem; the store is bounded in entries and bytes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

logger = logging.getLogger("vllm.omni.voices")  # under vLLM's logger: its handlers and level apply
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class VoiceStoreError(ValueError):
    """A voice the store refuses: ``status`` (HTTP) and a message saying what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StoredVoice:
    name: str
    voice: VoiceClonePrompt
    created: float
    consent: str
    size_bytes: int

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": "uploaded",
            "mode": "x_vector" if self.voice.x_vector_only else "in_context",
            "ref_text": self.voice.reference_text,
            "reference_frames": len(self.voice.reference_codes or ()),
            "created": self.created,
        }


def check_name(name: Any) -> str:
    """``name`` if it is a voice name (letters, digits, ``_``, ``-``; 1-64; starting alphanumeric)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise VoiceStoreError(400, "a voice name is 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return name


class VoiceStore:
    """The uploaded voices in ``directory`` (created on first save), at most ``max_voices`` of them in
    ``max_bytes`` (``--speech-max-voices``, ``--speech-max-voice-bytes``), for a talker of ``hidden_size``.

    The directory is the truth, so every API server process of one server sees the same voices: a name
    missing from this process's index is read from disk, a file gone from disk is dropped from it. A file
    that does not read as a voice of this talker (damaged, another model's width, codes out of range) is
    skipped with a warning, never served.
    """

    def __init__(self, directory: Path, max_voices: int, max_bytes: int, hidden_size: int, groups: int, codebook: int):
        self.directory, self.max_voices, self.max_bytes = directory, max_voices, max_bytes
        self.shape = (hidden_size, groups, codebook)
        self._lock = threading.Lock()
        self._voices: dict[str, StoredVoice] = {}

    def get(self, name: str) -> StoredVoice | None:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            return None
        path = self.directory / f"{name}.safetensors"
        with self._lock:
            if not path.is_file():
                self._voices.pop(name, None)
                return None
            if name not in self._voices:
                stored = self._read(path)
                if stored is None:
                    return None
                self._voices[name] = stored
            return self._voices[name]

    def list(self) -> list[StoredVoice]:
        names = sorted(p.stem for p in self.directory.glob("*.safetensors")) if self.directory.is_dir() else []
        return [stored for name in names if (stored := self.get(name)) is not None]

    def check_room(self, name: str, size_bytes: int = 0) -> None:
        """Raise unless ``name`` is free and one more voice (of ``size_bytes``, once known) fits: 409 or 507.
        A server checks before encoding and again, with the file's size, before writing."""
        check_name(name)
        if self.get(name) is not None:
            raise VoiceStoreError(409, f"a voice named {name!r} exists; DELETE it first or choose another name")
        voices = self.list()
        used = sum(v.size_bytes for v in voices)
        if len(voices) + 1 > self.max_voices or used + max(size_bytes, 1) > self.max_bytes:
            raise VoiceStoreError(
                507,
                f"the voice store is full ({len(voices)} voices, {used} bytes; limits {self.max_voices} voices, "
                f"{self.max_bytes} bytes): DELETE voices no longer used",
            )

    def save(self, name: str, voice: VoiceClonePrompt, consent: str) -> StoredVoice:
        """Write ``voice`` as ``name`` (atomically); 409 if the name is taken, 507 over the limits or unwritable."""
        from safetensors.numpy import save

        from vllm_omni.edge.files import write_atomically

        tensors = {"speaker_embedding": np.asarray(voice.speaker_embedding, dtype=np.float32)}
        if voice.reference_codes is not None:
            tensors["reference_codes"] = np.asarray(voice.reference_codes, dtype=np.int64)
        created = time.time()
        metadata = {"name": name, "ref_text": json.dumps(voice.reference_text), "consent": consent}
        data = save(tensors, metadata=metadata | {"created": repr(created)})
        self.check_room(name, len(data))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomically(self.directory / f"{name}.safetensors", lambda path: path.write_bytes(data))
        except OSError as error:
            logger.warning("cannot write voice %s: %s", name, error)
            raise VoiceStoreError(507, f"the server cannot store voices ({type(error).__name__})") from None
        stored = StoredVoice(name, voice, created, consent, len(data))
        with self._lock:
            self._voices[name] = stored
        return stored

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock:
            self._voices.pop(name, None)
            path = self.directory / f"{name}.safetensors"
            if not path.is_file():
                raise VoiceStoreError(404, f"no uploaded voice named {name!r}")
            path.unlink(missing_ok=True)

    def _read(self, path: Path) -> StoredVoice | None:
        """The voice in ``path``, or None (with a warning) if it is not one this talker can use."""
        try:
            return self._parse(path)
        except Exception as error:  # safetensors raises its own types for a damaged file
            logger.warning("voice file %s skipped: %s: %s", path, type(error).__name__, error)
            return None

    def _parse(self, path: Path) -> StoredVoice:
        from safetensors import safe_open

        from vllm_omni.model_executor.models.qwen3_tts.engine_ids import VOICE_SLOTS
        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

        hidden, groups, codebook = self.shape
        with safe_open(str(path), "np") as handle:
            metadata = handle.metadata() or {}
            names = set(handle.keys())
            embedding = handle.get_tensor("speaker_embedding")
            codes = handle.get_tensor("reference_codes") if "reference_codes" in names else None
        name = check_name(metadata.get("name", ""))
        reference_text = json.loads(metadata.get("ref_text", "null"))
        if name != path.stem or not (reference_text is None or isinstance(reference_text, str)):
            raise ValueError("its metadata does not name it, or its ref_text is not text")
        if embedding.shape != (hidden,) or not np.isfinite(embedding).all():
            raise ValueError(f"a speaker embedding of shape {embedding.shape}; this talker takes ({hidden},)")
        if codes is not None and (
            codes.ndim != 2 or codes.shape[1] != groups or not 0 < len(codes) < VOICE_SLOTS
            or codes.min() < 0 or codes.max() >= codebook
        ):  # fmt: skip
            raise ValueError(f"reference codes of shape {codes.shape} do not fit this talker")
        voice = VoiceClonePrompt(
            tuple(float(x) for x in embedding),
            None if codes is None else tuple(tuple(int(c) for c in frame) for frame in codes),
            reference_text,
        )
        created, consent = float(metadata.get("created", "0")), str(metadata.get("consent", ""))
        return StoredVoice(name, voice, created, consent, path.stat().st_size)


async def save_voice(request: Any, edge: Any) -> StoredVoice:
    """``POST /v1/audio/voices``: the upload (JSON or multipart) checked, encoded on the decode pool, stored.

    Fields: ``name``; ``audio`` (JSON: base64 or a data URL; multipart: a file); ``ref_text`` (in-context
    cloning) or ``x_vector_only_mode``; ``consent`` (required: who agreed to have this voice cloned).
    """
    from .speech import SpeechRequest
    from .speech_api import SpeechApiError, check_text, decode_audio_field, parse_json
    from .speech_http import read_body

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
    store.check_room(name)  # before the encoding's CPU time
    request_voice = SpeechRequest(text="Hello.", ref_audio=audio, ref_text=ref_text, x_vector_only_mode=x_vector_only)
    voice = await edge.encode_voice(request_voice)
    # A voice must leave room for text: its prompt is built once here, as a request would build it.
    await edge.prepare(SpeechRequest(text="Hello.", voice=voice), f"voice-check-{name}")
    return store.save(name, voice, consent.strip())
