"""Reference audio as a client sends it -> mono float32 samples at 24 kHz, for the model's voice encoders.

As the official ``qwen-tts`` 0.1.1 takes it: a file (bytes or a path) is decoded to float32 in [-1, 1]
(PyAV here, libsndfile/audioread there: the same values for PCM, ``int16 / 32768``) and channels are
averaged; an array is taken as ``(samples,)`` or ``(samples, channels)``, as
``Qwen3TTSModel._normalize_audio_inputs`` takes it; other rates go to 24 kHz
(``reference_audio.resample_to_24k``). Only accepted containers are opened (:func:`container_format`), and only
accepted codecs, mono or stereo, at most 48 kHz, are decoded (:func:`accepted_codec`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni.model_executor.models.qwen3_tts.reference_audio import (
    SAMPLE_RATE,
    ReferenceAudioError,
    resample_to_24k,
)

# Upper bound on a rate accepted from a caller's array (soxr itself takes any positive rate).
MAX_INPUT_RATE = 768_000
# A file's audio: its codec, channels and rate (a tiny FLAC of 8-channel 384 kHz silence would decode to
# hundreds of millions of samples within the duration limit).
ACCEPTED_CODECS = frozenset({"flac", "mp3", "mp3float", "vorbis", "libvorbis", "opus", "libopus"})
ACCEPTED_CODEC_NAMES = "PCM, FLAC, MP3, Vorbis or Opus"
MAX_FILE_CHANNELS = 2
MAX_FILE_RATE = 48_000
DEFAULT_MAX_SECONDS = 30.0  # the official examples use 3-10 s; 30 s is 375 frames of prompt

logger = logging.getLogger("vllm.omni.speech")


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
            raise ReferenceAudioError(  # what was read is never quoted: a fetched or local file may be anything
                f"{what} are not an accepted audio file: reference audio must be {ACCEPTED_FORMATS}"
            )
        return _demux(av, file, fmt, what, max_seconds)


def accepted_codec(name: str) -> bool:
    """Whether FFmpeg's decoder ``name`` is one a reference may use (:data:`ACCEPTED_CODECS`)."""
    return name.startswith("pcm_") or name in ACCEPTED_CODECS


def _check_layout(what: str, channels: int, rate: int) -> None:
    if not 0 < channels <= MAX_FILE_CHANNELS:
        raise ReferenceAudioError(
            f"{what} have {channels} channels; reference audio takes mono or stereo (at most {MAX_FILE_CHANNELS})"
        )
    if not 0 < rate <= MAX_FILE_RATE:
        raise ReferenceAudioError(
            f"{what} are sampled at {rate} Hz; reference audio takes at most {MAX_FILE_RATE} Hz (24 kHz is used)"
        )


def _demux(av: Any, file: Any, fmt: str, what: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Decode the first audio stream, refusing a codec, channel count or rate outside the accepted ones before
    decoding a frame, and every frame that changes them. The decoded samples are bounded by the duration limit
    at the highest rate and channel count taken, counted as they arrive."""
    chunks: list[np.ndarray] = []
    rate = 0
    total = 0
    try:
        with av.open(file, mode="r", format=fmt) as container:
            if not container.streams.audio:
                raise ReferenceAudioError(f"{what} hold no audio stream (expected an audio file: WAV, FLAC, MP3, ...)")
            stream = container.streams.audio[0]
            codec = stream.codec_context.name
            if not accepted_codec(codec):
                raise ReferenceAudioError(
                    f"{what} are coded as {codec!r}; reference audio takes {ACCEPTED_CODEC_NAMES} (re-encode it, "
                    "e.g. as 16-bit PCM WAV or FLAC)"
                )
            _check_layout(what, stream.codec_context.channels, stream.codec_context.sample_rate)
            for frame in container.decode(stream):
                if rate == 0:
                    rate = _check_rate(frame.sample_rate)
                elif frame.sample_rate != rate:
                    raise ReferenceAudioError(
                        f"{what}: the sample rate changes mid-stream ({rate} -> {frame.sample_rate} Hz)"
                    )
                _check_layout(what, len(frame.layout.channels), rate)
                chunk = _frame_samples(frame)
                total += chunk.shape[1]
                _check_duration(total, rate, max_seconds)
                chunks.append(chunk.mean(axis=0, dtype=np.float32) if chunk.shape[0] > 1 else chunk[0])
    except av.error.FFmpegError as error:
        logger.info("reference audio not decoded: %s: %s", type(error).__name__, error)
        raise ReferenceAudioError(f"{what} could not be decoded as audio; expected {ACCEPTED_FORMATS}") from None
    if not chunks:
        return np.zeros(0, dtype=np.float32), rate or SAMPLE_RATE
    return np.concatenate(chunks), rate
