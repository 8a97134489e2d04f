"""Reference audio -> a voice to clone: the speaker encoder and the speech tokenizer's encoder of a Base checkpoint.

As the official ``create_voice_clone_prompt``: the audio is decoded and resampled to 24 kHz
(:mod:`.reference_audio`), its speaker embedding comes from ``speaker_encoder.*``
(:mod:`.speaker_encoder`) and, for in-context cloning, its 16-codebook codes from the 12 Hz speech
tokenizer's encoder (:mod:`.tokenizer_12hz.encoder`). Both load on first use, from the model directory
(or its hub snapshot) the server serves.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from .prompt_builder import SpeechRequestError, VoiceClonePrompt


def model_directory(model: str) -> Path:
    """The local directory of ``model`` (a directory, or a hub id whose snapshot vLLM fetched already)."""
    local = Path(model)
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, allow_patterns=["*.json", "model*.safetensors", "speech_tokenizer/*"]))


class VoiceEncoders:
    """The two encoders of one Base checkpoint, loaded once on first use (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._speaker: Any = None
        self._codes: Any = None

    @classmethod
    def for_model(cls, model: str) -> VoiceEncoders:
        return cls(model_directory(model))

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._speaker is None:
                from .speaker_encoder import load_speaker_encoder
                from .tokenizer_12hz.encoder import load_speech_tokenizer_encoder

                self._speaker = load_speaker_encoder(self.directory)
                self._codes = load_speech_tokenizer_encoder(self.directory)
        return self._speaker, self._codes

    def clone(self, audio: Any, reference_text: str | None, x_vector_only: bool) -> VoiceClonePrompt:
        """The voice of ``audio`` (file bytes, a path, or ``(samples, sample_rate)``); its codes too unless
        ``x_vector_only``. Bad audio raises :class:`SpeechRequestError` saying what was expected."""
        from .reference_audio import ReferenceAudioError, load_reference_audio
        from .tokenizer_12hz.errors import InvalidAudioError

        speaker, codes = self._load()
        try:  # any audio the encoders cannot take (too short for the speaker encoder's kernels too) is the client's
            samples = load_reference_audio(audio)
            embedding = tuple(float(x) for x in speaker.embed(samples).reshape(-1).tolist())
            if x_vector_only:
                return VoiceClonePrompt(embedding)
            frames = codes.encode(samples)
        except (ReferenceAudioError, InvalidAudioError) as error:
            raise SpeechRequestError(f"ref_audio: {error}") from None
        return VoiceClonePrompt(embedding, tuple(tuple(int(c) for c in frame) for frame in frames), reference_text)

    def warm_up(self) -> None:
        """Load both encoders now (a server does it at start: the first clone then waits for no load)."""
        self._load()
