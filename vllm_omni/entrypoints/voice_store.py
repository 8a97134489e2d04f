"""Uploaded voices of a Base checkpoint, encoded once and kept on disk: ``POST/GET/DELETE /v1/audio/voices``.

A voice is one safetensors file under the server's artifacts directory (``voices/NAME.safetensors``):
``speaker_embedding`` (float32) and, for in-context cloning, ``reference_codes`` (int64 ``[T, 16]``),
with its transcript, mode and consent in the metadata. Later requests name it as ``voice`` and nothing
is encoded again; a restart reads the directory back. Names are checked against :data:`NAME_PATTERN`
before anything touches the filesystem; the store is bounded in entries and bytes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

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
    ``max_bytes`` (``--speech-max-voices``, ``--speech-max-voice-bytes``)."""

    def __init__(self, directory: Path, max_voices: int, max_bytes: int) -> None:
        self.directory, self.max_voices, self.max_bytes = directory, max_voices, max_bytes
        self._lock = threading.Lock()
        self._voices: dict[str, StoredVoice] = {}
        if directory.is_dir():
            for path in sorted(directory.glob("*.safetensors")):
                try:
                    stored = self._read(path)
                except (OSError, ValueError, KeyError):
                    continue  # a damaged file is not served; it stays for whoever wants to look at it
                self._voices[stored.name] = stored

    def get(self, name: str) -> StoredVoice | None:
        return self._voices.get(name) if isinstance(name, str) else None

    def list(self) -> list[StoredVoice]:
        return sorted(self._voices.values(), key=lambda v: v.name)

    def save(self, name: str, voice: VoiceClonePrompt, consent: str, replace: bool = False) -> StoredVoice:
        """Write ``voice`` as ``name`` (atomically); 409 if it exists and not ``replace``, 507 over the limits."""
        from safetensors.numpy import save

        check_name(name)
        tensors = {"speaker_embedding": np.asarray(voice.speaker_embedding, dtype=np.float32)}
        if voice.reference_codes is not None:
            tensors["reference_codes"] = np.asarray(voice.reference_codes, dtype=np.int64)
        created = time.time()
        metadata = {"name": name, "ref_text": json.dumps(voice.reference_text), "consent": consent}
        metadata["created"] = repr(created)
        data = save(tensors, metadata=metadata)
        with self._lock:
            old = self._voices.get(name)
            if old is not None and not replace:
                raise VoiceStoreError(409, f"a voice named {name!r} exists; DELETE it first or choose another name")
            count = len(self._voices) - (old is not None)
            used = sum(v.size_bytes for v in self._voices.values()) - (old.size_bytes if old else 0)
            if count + 1 > self.max_voices or used + len(data) > self.max_bytes:
                raise VoiceStoreError(
                    507,
                    f"the voice store is full ({count} voices, {used} bytes; limits {self.max_voices} voices, "
                    f"{self.max_bytes} bytes): DELETE voices no longer used",
                )
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                os.replace(temporary, self.directory / f"{name}.safetensors")
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
            stored = StoredVoice(name, voice, created, consent, len(data))
            self._voices[name] = stored
            return stored

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock:
            if self._voices.pop(name, None) is None:
                raise VoiceStoreError(404, f"no uploaded voice named {name!r}")
            (self.directory / f"{name}.safetensors").unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> StoredVoice:
        from safetensors import safe_open

        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

        with safe_open(str(path), "np") as handle:
            metadata = handle.metadata() or {}
            embedding = handle.get_tensor("speaker_embedding")
            names = set(handle.keys())
            codes = handle.get_tensor("reference_codes") if "reference_codes" in names else None
        name = check_name(metadata.get("name", path.stem))
        if name != path.stem:
            raise ValueError(f"{path} holds voice {name!r}")
        voice = VoiceClonePrompt(
            tuple(float(x) for x in embedding.reshape(-1)),
            None if codes is None else tuple(tuple(int(c) for c in frame) for frame in codes),
            json.loads(metadata.get("ref_text", "null")),
        )
        created, consent = float(metadata.get("created", "0")), metadata.get("consent", "")
        return StoredVoice(name, voice, created, consent, path.stat().st_size)


async def save_voice(request: Any, edge: Any) -> StoredVoice:
    """``POST /v1/audio/voices``: the upload (JSON or multipart) checked, encoded on the decode pool, stored.

    Fields: ``name``; ``audio`` (JSON: base64 or a data URL; multipart: a file); ``ref_text`` (in-context
    cloning) or ``x_vector_only_mode``; ``consent`` (required: who agreed to have this voice cloned).
    """
    from .speech import SpeechRequest
    from .speech_api import SpeechApiError, check_text, decode_audio_field, parse_json
    from .speech_http import read_body

    if edge.voice_store is None:
        raise SpeechApiError(400, "voices are uploaded to Base checkpoints; this one has only its own voices")
    limit = edge.limits.max_body_bytes
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            raise SpeechApiError(413, f"a multipart voice upload needs a Content-Length of at most {limit} bytes")
        form = await request.form(max_files=1, max_fields=8)
        fields = {key: value for key, value in form.items()}
        upload = fields.get("audio")
        audio = await upload.read() if hasattr(upload, "read") else None
        if isinstance(upload, str):
            audio = decode_audio_field(upload, "audio")
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
    if edge.voice_store.get(name) is not None:
        raise VoiceStoreError(409, f"a voice named {name!r} exists; DELETE it first or choose another name")
    request_voice = SpeechRequest(text=".", ref_audio=audio, ref_text=ref_text, x_vector_only_mode=x_vector_only)
    voice = await edge.decode(edge.generator.voice_prompt, request_voice)
    return edge.voice_store.save(name, voice, consent.strip())
