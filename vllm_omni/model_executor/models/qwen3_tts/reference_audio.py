"""Reference audio for voice cloning: decode, downmix, resample to 24 kHz, and the speaker encoder's log-mels.

What the official ``qwen-tts`` 0.1.1 does before ``extract_speaker_embedding``, without librosa:

* a file (bytes or a path) is decoded to float32 in [-1, 1] (PyAV here, libsndfile/audioread there: the
  same values for PCM, ``int16 / 32768``) and channels are averaged; an array is taken as
  ``(samples,)`` or ``(samples, channels)``, as ``Qwen3TTSModel._normalize_audio_inputs`` takes it;
* other rates go to 24 kHz with soxr at its "HQ" quality, then padded or cut to
  ``ceil(n * 24000 / rate)`` samples: what ``librosa.resample`` (its default ``res_type="soxr_hq"``,
  ``fix=True``) does;
* :func:`speaker_mel`: the official ``mel_spectrogram`` call (reflection-padded STFT, 1024-point Hann
  window, hop 256, magnitude, 128 slaney-normalized mel bands 0-12 kHz, ``log(max(x, 1e-5))``). The
  filterbank is computed here with numpy by librosa's formula (``librosa.filters.mel``, ``htk=False``,
  ``norm="slaney"``), so the serving venv needs no librosa.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

SAMPLE_RATE = 24000
# Upper bound on a rate accepted from a caller (soxr itself takes any positive rate).
MAX_INPUT_RATE = 768_000
DEFAULT_MAX_SECONDS = 30.0  # the official examples use 3-10 s; 30 s is 375 frames of prompt


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


# -- decoding and resampling ---------------------------------------------------------------------------------


def load_reference_audio(source: Any, *, max_seconds: float | None = DEFAULT_MAX_SECONDS) -> np.ndarray:
    """Mono float32 samples at 24 kHz from ``source``.

    ``source``: the bytes of an audio file (WAV, FLAC, MP3 or OGG: :func:`container_format`), a path to one,
    or ``(samples, sample_rate)`` with float samples in [-1, 1] shaped ``(n,)`` or
    ``(n, channels)``. ``max_seconds`` (None: no limit) bounds the input's duration, checked while
    decoding, before the whole file is held.

    Raises :class:`ReferenceAudioError` for undecodable bytes, a missing file, no audio stream, empty or
    too long audio, non-finite samples, integer arrays and impossible sample rates.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        samples, rate = _decode(io.BytesIO(bytes(source)), "the audio bytes", max_seconds)
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise ReferenceAudioError(f"reference audio file {path} does not exist (expected a path to an audio file)")
        samples, rate = _decode(str(path), str(path), max_seconds)
    elif isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], np.ndarray):
        samples, rate = _from_array(source[0], source[1], max_seconds)
    else:
        raise ReferenceAudioError(
            "reference audio must be audio file bytes, a path, or (numpy samples, sample_rate); found "
            f"{type(source).__name__}"
        )
    if samples.size == 0:
        raise ReferenceAudioError("reference audio is empty: expected at least one sample")
    if not np.isfinite(samples).all():
        raise ReferenceAudioError(
            f"reference audio has {int((~np.isfinite(samples)).sum())} non-finite samples (NaN or inf); expected "
            "finite samples in [-1, 1]"
        )
    return resample_to_24k(samples, rate)


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


def _check_rate(rate: Any) -> int:
    if isinstance(rate, bool) or not isinstance(rate, int | float | np.integer | np.floating):
        raise ReferenceAudioError(f"sample_rate must be a number of Hz, found {rate!r}")
    if not math.isfinite(rate) or rate != int(rate) or not 0 < rate <= MAX_INPUT_RATE:
        raise ReferenceAudioError(f"sample_rate must be a whole number of Hz in 1..{MAX_INPUT_RATE}, found {rate!r}")
    return int(rate)


def _check_duration(samples: int, rate: int, max_seconds: float | None) -> None:
    if max_seconds is not None and samples > max_seconds * rate:
        raise ReferenceAudioError(
            f"reference audio too long: more than {samples / rate:.2f} s at {rate} Hz, at most {max_seconds:g} s taken"
        )


def _from_array(samples: np.ndarray, rate: Any, max_seconds: float | None) -> tuple[np.ndarray, int]:
    rate = _check_rate(rate)
    if not np.issubdtype(samples.dtype, np.floating):
        raise ReferenceAudioError(
            f"reference samples must be floats in [-1, 1], found dtype {samples.dtype} (divide int16 PCM by 32768)"
        )
    if samples.ndim not in (1, 2):
        raise ReferenceAudioError(f"reference samples must be shaped (n,) or (n, channels), found {samples.shape}")
    _check_duration(samples.shape[0], rate, max_seconds)
    if samples.ndim == 2 and samples.shape[1] == 0:
        raise ReferenceAudioError(f"reference samples have no channel: shape {samples.shape}")
    samples = samples.astype(np.float32)
    if samples.ndim == 2:
        samples = samples.mean(axis=-1, dtype=np.float32)
    return np.ascontiguousarray(samples), rate


# PyAV sample formats (packed or planar) -> (offset, divisor) mapping them to [-1, 1), libsndfile's convention.
_FORMAT_OFFSET_SCALE = {
    "u8": (128.0, 128.0),
    "s16": (0.0, 32768.0),
    "s32": (0.0, 2147483648.0),
    "s64": (0.0, 9223372036854775808.0),
    "flt": (0.0, 1.0),
    "dbl": (0.0, 1.0),
}


def _frame_samples(frame: Any) -> np.ndarray:
    """One decoded frame as float32 ``[channels, n]``."""
    name = frame.format.name.removesuffix("p")
    if name not in _FORMAT_OFFSET_SCALE:
        raise ReferenceAudioError(f"unsupported decoded sample format {frame.format.name!r}")
    offset, scale = _FORMAT_OFFSET_SCALE[name]
    raw = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:
        raw = raw.reshape(-1, channels).T
    values = raw.astype(np.float64) if name in ("s32", "s64", "dbl") else raw.astype(np.float32)
    if offset:
        values = values - offset
    if scale != 1.0:
        values = values / scale
    return values.astype(np.float32)


ACCEPTED_FORMATS = "WAV, FLAC, MP3 or OGG (Vorbis, Opus, FLAC)"
_ID3_HEADER = 10


def container_format(head: bytes) -> str | None:
    """The FFmpeg demuxer of an accepted container, from the file's first bytes (None: not one of them).

    Only these containers are ever opened, with their own demuxer named: FFmpeg never probes the bytes, so a
    playlist (HLS), a concat script, a file naming a URL or a raw format is refused before any demuxer runs,
    and nothing but the bytes given is read (no file, no socket)."""
    if head[:3] == b"ID3" and len(head) >= _ID3_HEADER:  # an ID3v2 tag (MP3, sometimes FLAC): skip it
        size = _ID3_HEADER + sum((byte & 0x7F) << (7 * (3 - index)) for index, byte in enumerate(head[6:10]))
        size += _ID3_HEADER if head[5] & 0x10 else 0  # a footer
        rest = head[size:]
        return "flac" if rest[:4] == b"fLaC" else "mp3"
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:  # an MPEG audio frame
        return "mp3"
    return None


def _decode(file: Any, what: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Decode the first audio stream of ``file`` (a path or a binary file object) to mono float32: an accepted
    container only (:func:`container_format`), read through Python's file object (no FFmpeg protocol)."""
    try:
        import av
    except ImportError as error:
        raise ImportError("decoding reference audio needs PyAV: pip install -r requirements/vllm.txt") from error

    with contextlib.ExitStack() as stack:
        if isinstance(file, str):
            file = stack.enter_context(open(file, "rb"))
        head = file.read(1 << 16)
        file.seek(0)
        fmt = container_format(head)
        if fmt is None:
            raise ReferenceAudioError(
                f"{what} are not an accepted audio file: reference audio must be {ACCEPTED_FORMATS} (it starts "
                f"with {head[:8]!r})"
            )
        return _demux(av, file, fmt, what, max_seconds)


def _demux(av: Any, file: Any, fmt: str, what: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    chunks: list[np.ndarray] = []
    rate = 0
    total = 0
    try:
        with av.open(file, mode="r", format=fmt) as container:
            if not container.streams.audio:
                raise ReferenceAudioError(f"{what} hold no audio stream (expected an audio file: WAV, FLAC, MP3, ...)")
            stream = container.streams.audio[0]
            for frame in container.decode(stream):
                if rate == 0:
                    rate = _check_rate(frame.sample_rate)
                elif frame.sample_rate != rate:
                    raise ReferenceAudioError(
                        f"{what}: the sample rate changes mid-stream ({rate} -> {frame.sample_rate} Hz)"
                    )
                chunk = _frame_samples(frame)
                total += chunk.shape[1]
                _check_duration(total, rate, max_seconds)
                chunks.append(chunk.mean(axis=0, dtype=np.float32) if chunk.shape[0] > 1 else chunk[0])
    except av.error.FFmpegError as error:
        raise ReferenceAudioError(
            f"{what} could not be decoded as audio ({error}); expected {ACCEPTED_FORMATS}"
        ) from None
    if not chunks:
        return np.zeros(0, dtype=np.float32), rate or SAMPLE_RATE
    return np.concatenate(chunks), rate


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
