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


class WavWriter:
    """A 16-bit mono WAV written as audio arrives; ``close()`` finishes the header and renames it into place.

    Until then the file sits beside ``path`` as ``.<stem>.partial.wav``. ``close()`` is also what
    an error path calls: the audio written so far lands intact at ``path``.
    """

    def __init__(self, path: str | os.PathLike[str], sample_rate: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sample_rate = sample_rate
        self.samples = 0
        self._temporary = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix}")
        self._wave = wave.open(str(self._temporary), "wb")  # noqa: SIM115 (closed by close())
        self._wave.setnchannels(1)
        self._wave.setsampwidth(2)
        self._wave.setframerate(sample_rate)

    def write(self, samples: np.ndarray) -> None:
        pcm = float_to_pcm16(np.ravel(samples))
        self._wave.writeframes(pcm.tobytes())
        self.samples += pcm.size

    def close(self) -> Path:
        if self._wave is not None:
            self._wave.close()
            self._wave = None
            os.replace(self._temporary, self.path)
        return self.path

    def discard(self) -> None:
        """Drop the temporary file and leave ``path`` as it was (for a run that produced no audio)."""
        if self._wave is not None:
            self._wave.close()
            self._wave = None
            self._temporary.unlink(missing_ok=True)

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
