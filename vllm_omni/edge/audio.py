"""PCM and audio-quality helpers shared by the demo, exporters, tests and benchmarks (numpy only)."""

from __future__ import annotations

import os
import wave
from dataclasses import dataclass
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
    """Signal-to-noise ratio of ``estimate`` against ``reference`` in dB, in float64 (inf when identical,
    -inf against an all-zero reference)."""
    reference = np.asarray(reference, dtype=np.float64).ravel()
    noise = float(((np.asarray(estimate, dtype=np.float64).ravel() - reference) ** 2).sum())
    if noise == 0:
        return float("inf")
    signal = float((reference**2).sum())
    if signal == 0:
        return float("-inf")
    return float(10 * np.log10(signal / noise))


def peak_error_dbfs(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Largest ``|estimate - reference|`` in dB against full scale (1.0: audio is in [-1, 1]); -inf when identical."""
    error = np.abs(np.asarray(estimate, dtype=np.float64).ravel() - np.asarray(reference, dtype=np.float64).ravel())
    peak = float(error.max()) if error.size else 0.0
    return float(20 * np.log10(peak)) if peak > 0 else float("-inf")


@dataclass(frozen=True)
class ReferenceMatch:
    """How far a decode is from its reference, against a bar of ``min_db`` dB.

    A decode matches when its SNR is >= ``min_db`` *or* its peak error is at or below ``-min_db``
    dBFS (max abs ``10 ** (-min_db / 20)``): the error a full-scale reference could carry at that
    SNR. SNR alone calls a correct graph wrong when the reference is near silent (a random
    checkpoint whose decode has RMS 1e-9: float32 rounding of the O(1) activations is then
    "large" against the signal, yet far below anything audible; at a 90 dB bar the allowance is
    about one LSB of 16-bit PCM). A wrong graph still fails: its error is large against full
    scale too (noise at 1e-3 is -60 dBFS).
    """

    snr_db: float
    error_dbfs: float
    min_db: float

    @property
    def max_abs(self) -> float:
        """The peak error as a sample value (0.0 when identical)."""
        return float(10 ** (self.error_dbfs / 20))

    @property
    def passed(self) -> bool:
        return self.snr_db >= self.min_db or self.error_dbfs <= -self.min_db

    def to_json(self) -> dict[str, float]:
        """The numbers a verification record keeps: ``snr_db`` and ``max_abs_diff``."""
        return {"snr_db": self.snr_db, "max_abs_diff": self.max_abs}

    def describe(self) -> str:
        """``SNR 3.8 dB, peak error -169.8 dBFS (max abs 3.25e-09)``."""
        return f"SNR {self.snr_db:.1f} dB, peak error {self.error_dbfs:.1f} dBFS (max abs {self.max_abs:.3g})"

    def bar(self) -> str:
        """The rule, for messages: ``>= 90 dB SNR, or a peak error <= -90 dBFS (max abs 3.16e-05)``."""
        return (
            f">= {self.min_db:g} dB SNR, or a peak error <= {-self.min_db:g} dBFS "
            f"(max abs {10 ** (-self.min_db / 20):.3g})"
        )


def match_reference(reference: np.ndarray, estimate: np.ndarray, min_db: float) -> ReferenceMatch:
    """Judge ``estimate`` against ``reference`` (same shape, float samples in [-1, 1]); see :class:`ReferenceMatch`."""
    return ReferenceMatch(snr_db(reference, estimate), peak_error_dbfs(reference, estimate), float(min_db))


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
