"""Where a released checkpoint keeps its 12 Hz speech tokenizer (the decoder's and the encoder's files)."""

from __future__ import annotations

from pathlib import Path

SPEECH_TOKENIZER_DIR = "speech_tokenizer"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def find_speech_tokenizer_dir(path: Path) -> Path | None:
    """``path/speech_tokenizer`` or ``path`` itself, whichever holds ``config.json`` and ``model.safetensors``;
    None when neither does (callers say what they expected)."""
    for candidate in (path / SPEECH_TOKENIZER_DIR, path):
        if (candidate / CONFIG_FILE).is_file() and (candidate / WEIGHTS_FILE).is_file():
            return candidate
    return None
