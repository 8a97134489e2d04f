"""Reference samples -> a voice to clone: the speaker encoder and the speech tokenizer's encoder of a Base checkpoint.

As the official ``create_voice_clone_prompt``: from mono 24 kHz samples (a server decodes the client's file:
``vllm_omni.entrypoints.generation.reference_decoding``), the speaker embedding comes from ``speaker_encoder.*``
(:mod:`.speaker_encoder`) and, for in-context cloning, the 16-codebook codes from the 12 Hz speech
tokenizer's encoder (:mod:`.tokenizer_12hz.encoder`). Both load on first use, from the local model directory
the server serves.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from .prompt_builder import SpeechRequestError, VoiceClonePrompt


class VoiceEncoders:
    """The two encoders of one Base checkpoint, loaded once on first use (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._speaker: Any = None
        self._codes: Any = None

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._speaker is None:
                from .speaker_encoder import load_speaker_encoder
                from .tokenizer_12hz.encoder import load_speech_tokenizer_encoder

                self._speaker = load_speaker_encoder(self.directory)
                self._codes = load_speech_tokenizer_encoder(self.directory)
        return self._speaker, self._codes

    def clone(self, samples: np.ndarray, reference_text: str | None, x_vector_only: bool) -> VoiceClonePrompt:
        """The voice of ``samples`` (mono float32 at 24 kHz); its codes too unless ``x_vector_only``. Audio the
        encoders cannot take raises :class:`SpeechRequestError` saying what was expected."""
        from .reference_audio import ReferenceAudioError
        from .tokenizer_12hz.errors import InvalidAudioError

        speaker, codes = self._load()
        try:  # any audio the encoders cannot take (too short for the speaker encoder's kernels too) is the client's
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
