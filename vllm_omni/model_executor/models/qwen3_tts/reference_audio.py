"""Reference audio for voice cloning, as arrays: resampling to 24 kHz and the speaker encoder's log-mels.

What the official ``qwen-tts`` 0.1.1 does before ``extract_speaker_embedding``, without librosa (decoding a
client's file to samples is the server's job: ``vllm_omni.entrypoints.generation.reference_decoding``):

* other rates go to 24 kHz with soxr at its "HQ" quality, then padded or cut to
  ``ceil(n * 24000 / rate)`` samples: what ``librosa.resample`` (its default ``res_type="soxr_hq"``,
  ``fix=True``) does;
* :func:`speaker_mel`: the official ``mel_spectrogram`` call (reflection-padded STFT, 1024-point Hann
  window, hop 256, magnitude, 128 slaney-normalized mel bands 0-12 kHz, ``log(max(x, 1e-5))``). The
  filterbank is computed here with numpy by librosa's formula (``librosa.filters.mel``, ``htk=False``,
  ``norm="slaney"``), so the serving venv needs no librosa.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

SAMPLE_RATE = 24000


class ReferenceAudioError(ValueError):
    """Reference audio that cannot be used: its message says what was expected and what was found."""


@dataclass(frozen=True)
class SpeakerMelSettings:
    """The features the official ``extract_speaker_embedding`` computes (fixed in its code, not in the config)."""

    sample_rate: int = SAMPLE_RATE
    n_fft: int = 1024
    win_length: int = 1024
    hop_length: int = 256
    n_mels: int = 128
    fmin: float = 0.0
    fmax: float = 12000.0
    log_floor: float = 1e-5
    magnitude_eps: float = 1e-9  # added to |X|^2 before the square root

    @property
    def padding(self) -> int:
        """Reflection padding on each side before the (uncentred) STFT."""
        return (self.n_fft - self.hop_length) // 2

    def frames(self, samples: int) -> int:
        return (samples + 2 * self.padding - self.n_fft) // self.hop_length + 1

    def samples_for_frames(self, frames: int) -> int:
        """Fewest samples giving ``frames`` feature frames (reflection padding also needs more than it pads)."""
        return max((frames - 1) * self.hop_length + self.n_fft - 2 * self.padding, self.padding + 1)


SPEAKER_MEL = SpeakerMelSettings()


# -- resampling ------------------------------------------------------------------------------------------------


def resample_to_24k(samples: np.ndarray, rate: int) -> np.ndarray:
    """``samples`` (1-D float32) at ``rate`` Hz -> 24 kHz, exactly as ``librosa.resample(..., res_type="soxr_hq")``."""
    if rate == SAMPLE_RATE:
        return samples
    try:
        import soxr
    except ImportError as error:
        raise ImportError("resampling reference audio needs soxr: pip install -r requirements/vllm.txt") from error
    resampled = soxr.resample(samples, rate, SAMPLE_RATE, quality="HQ")
    length = int(np.ceil(samples.shape[-1] * (float(SAMPLE_RATE) / rate)))  # librosa's float expression
    if resampled.shape[-1] < length:
        resampled = np.pad(resampled, (0, length - resampled.shape[-1]))
    return np.ascontiguousarray(resampled[:length], dtype=np.float32)


# -- the speaker encoder's features ---------------------------------------------------------------------------


# Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4);
# the constants are computed as librosa computes them, so the filterbank is equal bit for bit.
_HZ_PER_MEL = 200.0 / 3
_LOG_REGION_HZ = 1000.0
_LOG_REGION_MEL = _LOG_REGION_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel_slaney(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mels = hz / _HZ_PER_MEL
    log_region = hz >= _LOG_REGION_HZ
    mels[log_region] = _LOG_REGION_MEL + np.log(hz[log_region] / _LOG_REGION_HZ) / _LOG_STEP
    return mels


def _mel_to_hz_slaney(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    hz = _HZ_PER_MEL * mels
    log_region = mels >= _LOG_REGION_MEL
    hz[log_region] = _LOG_REGION_HZ * np.exp(_LOG_STEP * (mels[log_region] - _LOG_REGION_MEL))
    return hz


@functools.lru_cache(maxsize=4)
def slaney_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Triangular mel filters ``[n_mels, n_fft // 2 + 1]`` (float32), each scaled to unit area in Hz x 2.

    The formula and the float64 -> float32 steps of ``librosa.filters.mel(htk=False, norm="slaney")``, so
    the table equals librosa's (the tests compare them). Read-only: it is shared between calls.
    """
    bin_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    edges = _mel_to_hz_slaney(
        np.linspace(_hz_to_mel_slaney(np.array([fmin]))[0], _hz_to_mel_slaney(np.array([fmax]))[0], n_mels + 2)
    )
    widths = np.diff(edges)
    offsets = np.subtract.outer(edges, bin_hz)  # [n_mels + 2, bins]: edge minus bin frequency
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling)).astype(np.float32)
    area = 2.0 / (edges[2:] - edges[:-2])
    weights = (weights.astype(np.float64) * area[:, None]).astype(np.float32)
    weights.setflags(write=False)
    return weights


@functools.lru_cache(maxsize=4)
def _filterbank_tensor(settings: SpeakerMelSettings) -> torch.Tensor:
    return torch.from_numpy(
        slaney_mel_filterbank(
            settings.sample_rate, settings.n_fft, settings.n_mels, settings.fmin, settings.fmax
        ).copy()
    )


def speaker_mel(samples_24k: np.ndarray | torch.Tensor, settings: SpeakerMelSettings = SPEAKER_MEL) -> torch.Tensor:
    """Log-mel features ``[frames, n_mels]`` (float32, CPU) of mono 24 kHz samples, as the official encoder takes.

    ``frames = (n + 2 * 384 - 1024) // 256 + 1``. Raises :class:`ReferenceAudioError` below one frame's worth.
    """
    waveform = torch.as_tensor(samples_24k, dtype=torch.float32).cpu()
    if waveform.ndim != 1:
        raise ReferenceAudioError(f"speaker_mel takes mono samples shaped (n,), found {tuple(waveform.shape)}")
    needed = settings.samples_for_frames(1)
    if waveform.shape[0] < needed:
        raise ReferenceAudioError(
            f"reference audio too short: {waveform.shape[0]} samples at {settings.sample_rate} Hz, at least "
            f"{needed} needed"
        )
    padded = torch.nn.functional.pad(waveform[None, None], (settings.padding, settings.padding), mode="reflect")[0]
    spectrum = torch.stft(
        padded,
        settings.n_fft,
        hop_length=settings.hop_length,
        win_length=settings.win_length,
        window=torch.hann_window(settings.win_length),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(spectrum.real.square() + spectrum.imag.square() + settings.magnitude_eps)
    mels = torch.matmul(_filterbank_tensor(settings), magnitude)
    return torch.log(mels.clamp(min=settings.log_floor))[0].transpose(0, 1).contiguous()
