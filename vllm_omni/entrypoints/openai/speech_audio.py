"""OpenAI speech ``response_format`` bodies, encoded as the PCM arrives: mp3, opus, aac, flac, wav, pcm.

Input is what the server decodes: mono s16le PCM, in chunks of any size. :class:`AudioEncoder` turns it into
a stream of bytes whose concatenation is a complete file of the format; each call returns what is ready
and keeps nothing else, so memory stays bounded whatever the length. ``speed`` time-stretches keeping the
pitch (ffmpeg's ``atempo``). Encoding is CPU work: callers run ``encode``/``finish`` in a worker thread.
PyAV (``av``, in requirements/vllm.txt) is imported when an encoder is made, so the constants and the
validation import without it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

# response_format -> the media type its body is sent with.
AUDIO_FORMATS: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# OpenAI's accepted speed range, both ends included.
SPEED_RANGE = (0.25, 4.0)

# One atempo instance stays within this factor range: ffmpeg blends samples only inside it (above 2.0 it
# skips samples; older builds reject anything outside), so larger changes chain equal factors.
_ATEMPO_RANGE = (0.5, 2.0)

_SAMPLE_BYTES = 2  # s16


# The data size a streamed WAV header carries: the length is not known when the header leaves.
UNKNOWN_LENGTH = 0xFFFFFFFF - 36


def wav_header(data_bytes: int, sample_rate: int) -> bytes:
    """A 16-bit mono WAV header; ``data_bytes`` :data:`UNKNOWN_LENGTH` marks a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


class AudioFormatError(ValueError):
    """A ``response_format`` or ``speed`` the encoder cannot produce."""


@dataclass(frozen=True)
class _Muxed:
    """How a compressed format is made: the ffmpeg muxer and encoder, and the encoder's bitrate."""

    container: str
    codec: str
    bit_rate: int | None
    container_options: tuple[tuple[str, str], ...] = ()


# Ogg pages close every 100 ms instead of ffmpeg's 1 s, so a streamed opus body is not held back a second.
_MUXED = {
    "mp3": _Muxed("mp3", "libmp3lame", 64_000),
    "opus": _Muxed("ogg", "libopus", 32_000, (("page_duration", "100000"),)),
    "aac": _Muxed("adts", "aac", 64_000),
    "flac": _Muxed("flac", "flac", None),
}


def check_audio_format(fmt: str) -> str:
    """``fmt`` if it is a known ``response_format``; raises :class:`AudioFormatError` otherwise."""
    if fmt not in AUDIO_FORMATS:
        raise AudioFormatError(f"response_format must be one of {sorted(AUDIO_FORMATS)}, got {fmt!r}")
    return fmt


def check_speed(speed: float) -> float:
    """``speed`` as a float if it is a finite number within :data:`SPEED_RANGE`; raises otherwise."""
    low, high = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise AudioFormatError(f"speed must be a number in [{low}, {high}], got {type(speed).__name__} {speed!r}")
    if not math.isfinite(speed) or not low <= speed <= high:
        raise AudioFormatError(f"speed must be a number in [{low}, {high}], got {speed!r}")
    return float(speed)


def atempo_factors(speed: float) -> list[float]:
    """Equal atempo factors, each within [0.5, 2.0], whose product is ``speed`` (none for 1.0)."""
    if speed == 1.0:
        return []
    count = math.ceil(abs(math.log2(speed)) - 1e-12)
    return [speed ** (1.0 / count)] * count


def _import_av() -> Any:
    try:
        import av
    except ImportError as error:
        raise ImportError(
            "encoding speech as mp3/opus/aac/flac or at speed != 1 needs PyAV: "
            "install requirements/vllm.txt in the serving venv (`make setup-vllm`)"
        ) from error
    return av


class _ChunkSink:
    """A write-only, non-seekable file for the muxer: what it writes waits here until drained.

    Having no ``seek`` tells the muxer the output is a stream, so it never goes back to patch a header.
    """

    def __init__(self) -> None:
        self._pieces: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._pieces.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out = b"".join(self._pieces)
        self._pieces.clear()
        return out


class _TimeStretch:
    """s16 mono frames in, frames ``1 / speed`` as long out, pitch kept: abuffer -> atempo... -> abuffersink.

    atempo works on windows of tens of milliseconds and keeps back what does not fill one, so the end is
    flushed through silence and cut to ``round(samples in / speed)``: any input, however short, comes out
    at its stretched length.
    """

    def __init__(self, av: Any, sample_rate: int, speed: float) -> None:
        self._av = av
        self._sample_rate, self._speed = sample_rate, speed
        self._samples_in = self._samples_out = 0
        self._graph = av.filter.Graph()
        nodes = [
            self._graph.add_abuffer(
                sample_rate=sample_rate, format="s16", layout="mono", time_base=Fraction(1, sample_rate)
            )
        ]
        nodes += [self._graph.add("atempo", f"{factor:.9f}") for factor in atempo_factors(speed)]
        nodes.append(self._graph.add("aformat", "sample_fmts=s16:channel_layouts=mono"))
        nodes.append(self._graph.add("abuffersink"))
        self._graph.link_nodes(*nodes).configure()

    def push(self, frame: Any) -> list[Any]:
        self._samples_in += frame.samples
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> list[Any]:
        pad = self._sample_rate // 5  # 200 ms of silence: more than atempo's window at any factor used
        silence = self._av.AudioFrame.from_ndarray(np.zeros((1, pad), np.int16), format="s16", layout="mono")
        silence.sample_rate = self._sample_rate
        silence.time_base = Fraction(1, self._sample_rate)
        silence.pts = self._samples_in
        self._graph.push(silence)
        self._graph.push(None)
        return self._pull(limit=round(self._samples_in / self._speed))

    def _pull(self, limit: int | None = None) -> list[Any]:
        frames = []
        while True:
            try:
                frame = self._graph.pull()
            except (self._av.error.BlockingIOError, self._av.error.EOFError):
                return frames
            if limit is not None:
                keep = max(0, limit - self._samples_out)
                if keep == 0:
                    continue
                if frame.samples > keep:
                    frame = self._cut(frame, keep)
            self._samples_out += frame.samples
            frames.append(frame)

    def _cut(self, frame: Any, samples: int) -> Any:
        head = self._av.AudioFrame.from_ndarray(frame.to_ndarray()[:, :samples], format="s16", layout="mono")
        head.sample_rate, head.time_base, head.pts = frame.sample_rate, frame.time_base, frame.pts
        return head


class _RawSink:
    """s16 frames -> their little-endian bytes (pcm, and wav after its header)."""

    def write(self, frames: list[Any]) -> bytes:
        return b"".join(frame.to_ndarray().astype("<i2", copy=False).tobytes() for frame in frames)

    def finish(self) -> bytes:
        return b""


class _MuxSink:
    """Frames -> encoder -> muxer -> bytes, drained after every call.

    ``flush_packets`` writes each packet through at once instead of filling PyAV's 32 KiB I/O buffer first;
    ``bitexact`` makes the same audio the same bytes (a fixed Ogg serial number, no version tag).
    """

    def __init__(self, av: Any, muxed: _Muxed, sample_rate: int) -> None:
        self._file = _ChunkSink()
        options = {"flush_packets": "1", "fflags": "+bitexact", **dict(muxed.container_options)}
        self._container = av.open(self._file, mode="w", format=muxed.container, container_options=options)
        codec = av.codec.Codec(muxed.codec, "w")
        rates = codec.audio_rates
        rate = sample_rate if not rates or sample_rate in rates else _nearest_rate(sample_rate, rates)
        self._stream = self._container.add_stream(muxed.codec, rate=rate, layout="mono")
        if muxed.bit_rate is not None:
            self._stream.bit_rate = muxed.bit_rate

    def write(self, frames: list[Any]) -> bytes:
        for frame in frames:
            self._container.mux(self._stream.encode(frame))
        return self._file.drain()

    def finish(self) -> bytes:
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return self._file.drain()


def _nearest_rate(sample_rate: int, rates: list[int]) -> int:
    """The lowest supported rate at or above ``sample_rate`` (nothing lost), else the highest."""
    above = [rate for rate in rates if rate >= sample_rate]
    return min(above) if above else max(rates)


class AudioEncoder:
    """Mono s16le PCM at ``sample_rate`` -> a ``fmt`` body, incrementally.

    ``encode`` takes any number of bytes (an odd byte waits for its other half) and returns the bytes
    ready so far, maybe none; ``finish`` flushes and returns the rest. All returned bytes concatenated are
    one complete file: mp3 (libmp3lame, 64 kb/s), opus (libopus in Ogg, 32 kb/s), aac (ADTS, 64 kb/s),
    flac, wav (a header of unknown length, :func:`wav_header`, then PCM) or pcm (raw s16le). The output
    keeps ``sample_rate`` where the codec supports it (libopus takes 24 kHz; its decoders output 48 kHz,
    as Opus always does). wav and pcm at speed 1.0 do not touch PyAV: the input passes through bit-exact.
    """

    def __init__(self, fmt: str, sample_rate: int, speed: float = 1.0) -> None:
        self.fmt = check_audio_format(fmt)
        self.speed = check_speed(speed)
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate <= 0:
            raise AudioFormatError(f"sample_rate must be a positive int (Hz), got {sample_rate!r}")
        self.sample_rate = sample_rate
        self._header = wav_header(UNKNOWN_LENGTH, sample_rate) if fmt == "wav" else b""
        self._half_sample = b""
        self._samples_in = 0
        self._finished = False
        self._passthrough = fmt in ("wav", "pcm") and self.speed == 1.0
        if self._passthrough:
            return
        av = _import_av()
        self._av = av
        self._stretch = _TimeStretch(av, sample_rate, self.speed) if self.speed != 1.0 else None
        self._sink = _RawSink() if fmt in ("wav", "pcm") else _MuxSink(av, _MUXED[fmt], sample_rate)

    def encode(self, pcm: bytes) -> bytes:
        """The encoded bytes ready after ``pcm`` (s16le mono, any length); may be ``b""``."""
        self._check_open()
        pcm = self._half_sample + bytes(pcm)
        whole = len(pcm) - len(pcm) % _SAMPLE_BYTES
        pcm, self._half_sample = pcm[:whole], pcm[whole:]
        if self._passthrough:
            return self._take_header() + pcm
        if not pcm:
            return self._take_header()
        frame = self._frame(pcm)
        frames = self._stretch.push(frame) if self._stretch is not None else [frame]
        return self._take_header() + self._sink.write(frames)

    def finish(self) -> bytes:
        """The rest of the body: the encoder's and time-stretch's buffered audio, and the trailer.

        A lone trailing byte (half a sample; a decoder never sends one) is dropped.
        """
        self._check_open()
        self._finished = True
        if self._passthrough:
            return self._take_header()
        frames = self._stretch.flush() if self._stretch is not None else []
        return self._take_header() + self._sink.write(frames) + self._sink.finish()

    def _frame(self, pcm: bytes) -> Any:
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False).reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.time_base = Fraction(1, self.sample_rate)
        frame.pts = self._samples_in
        self._samples_in += samples.shape[1]
        return frame

    def _take_header(self) -> bytes:
        header, self._header = self._header, b""
        return header

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"this {self.fmt} encoder is finished; make a new AudioEncoder per response")
