"""PCM and audio-quality helpers shared by the demo, exporters, tests and benchmarks (numpy only)."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np

from .files import write_atomically


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """``float[-1, 1]`` -> ``int16``; values outside [-1, 1] are clipped."""
    return (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")


def write_wav(path: str | os.PathLike[str], samples: np.ndarray, sample_rate: int) -> Path:
    """Write mono float samples as a 16-bit PCM WAV file (via a temporary name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(temporary: Path) -> None:
        with wave.open(str(temporary), "wb") as handle:
            handle.setnchannels(1)
            handle.setsampwidth(2)
            handle.setframerate(sample_rate)
            handle.writeframes(float_to_pcm16(np.ravel(samples)).tobytes())

    return write_atomically(path, write)


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Signal-to-noise ratio of ``estimate`` against ``reference`` in dB, in float64 (inf when identical)."""
    reference = np.asarray(reference, dtype=np.float64).ravel()
    noise = float(((np.asarray(estimate, dtype=np.float64).ravel() - reference) ** 2).sum())
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(float((reference**2).sum()) / noise))
