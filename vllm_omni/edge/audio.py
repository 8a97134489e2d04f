"""PCM helpers shared by the demo, the client and the benchmarks (numpy only, no torch)."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """``float[-1, 1]`` -> ``int16``; values outside [-1, 1] are clipped."""
    return (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")


def write_wav(path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int) -> Path:
    """Write mono float samples as a 16-bit PCM WAV file (via a temporary name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.partial")
    with wave.open(str(temporary), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(float_to_pcm16(np.ravel(samples)).tobytes())
    os.replace(temporary, path)
    return path


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Read a mono 16-bit WAV file as ``(float32 samples in [-1, 1], sample_rate)``."""
    with wave.open(str(path), "rb") as handle:
        if handle.getnchannels() != 1 or handle.getsampwidth() != 2:
            raise ValueError(
                f"{path}: expected mono 16-bit PCM, found {handle.getnchannels()} channel(s) of "
                f"{8 * handle.getsampwidth()} bits"
            )
        frames = handle.readframes(handle.getnframes())
        return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32767.0, handle.getframerate()
