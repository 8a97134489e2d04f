"""The speech response formats: each streamed body decodes back to the input, at the right length and pitch."""

from __future__ import annotations

import io
import itertools
import math

import av
import numpy as np
import pytest

from vllm_omni.entrypoints.openai.speech_audio import (
    AUDIO_FORMATS,
    SPEED_RANGE,
    UNKNOWN_LENGTH,
    AudioEncoder,
    AudioFormatError,
    atempo_factors,
    wav_header,
)

pytestmark = pytest.mark.vllm

SAMPLE_RATE = 24_000
# Uneven chunk sizes in bytes, odd ones and an empty one included, as a decoder might hand them over.
CHUNK_BYTES = (1, 999, 0, 3, 4801, 7777, 2)

# format -> (ffmpeg demuxer name, decoder name) of the decoded-back body.
CONTAINERS = {
    "mp3": ("mp3", "mp3float"),
    "opus": ("ogg", "opus"),
    "aac": ("aac", "aac"),
    "flac": ("flac", "flac"),
    "wav": ("wav", "pcm_s16le"),
}
# Samples a decoder returns beyond the input: the encoder's priming delay plus padding to a whole frame.
# mp3: no Xing/LAME tag on a stream, so decoders keep libmp3lame's 1105-sample delay and the last 576-sample
# granule's padding (measured +1440 for 1.5 s). aac: 1024 priming + padding to 1024 (measured +1888).
# opus: the Ogg pre-skip and end granule trim it exactly. The lossless ones are exact.
EXTRA_SAMPLES = {"mp3": 1105 + 576, "aac": 2 * 1024, "opus": 0, "flac": 0, "wav": 0, "pcm": 0}
# Measured with av 18.1.0 (ffmpeg 8) on the test signal: mp3 26.0 dB, opus 31.8 dB, aac 34.8 dB.
MIN_SNR_DB = {"mp3": 20.0, "opus": 25.0, "aac": 28.0}


def speech_like(seconds: float = 1.5) -> np.ndarray:
    """Three partials (220, 660, 1500 Hz) under a half-sine envelope, as int16."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    partials = (
        0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 660 * t + 1.0) + 0.1 * np.sin(2 * np.pi * 1500 * t)
    )
    return (partials * np.sin(np.pi * t / seconds) * 32767).astype(np.int16)


def tone(frequency: float, seconds: float = 1.5) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * frequency * t) * 32767).astype(np.int16)


def stream(encoder: AudioEncoder, pcm: bytes) -> list[bytes]:
    """Every piece ``encode``/``finish`` return, feeding ``pcm`` in :data:`CHUNK_BYTES` chunks."""
    pieces, start = [], 0
    for size in itertools.cycle(CHUNK_BYTES):
        if start >= len(pcm):
            break
        pieces.append(encoder.encode(pcm[start : start + size]))
        start += size
    pieces.append(encoder.finish())
    return pieces


def encode_streamed(fmt: str, samples: np.ndarray, speed: float = 1.0) -> bytes:
    return b"".join(stream(AudioEncoder(fmt, SAMPLE_RATE, speed), samples.astype("<i2").tobytes()))


def decode(fmt: str, body: bytes) -> np.ndarray:
    """The body back as int16 samples at 24 kHz; checks its container and codec are the format's."""
    if fmt == "pcm":
        return np.frombuffer(body, dtype="<i2")
    with av.open(io.BytesIO(body)) as container:
        audio = container.streams.audio[0]
        assert (container.format.name, audio.codec_context.name) == CONTAINERS[fmt]
        assert audio.codec_context.channels == 1
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)  # opus decodes at 48 kHz
        frames = [out for frame in container.decode(audio) for out in resampler.resample(frame)]
        frames += resampler.resample(None)
    return np.concatenate([frame.to_ndarray()[0] for frame in frames])


def aligned_snr_db(reference: np.ndarray, decoded: np.ndarray, max_delay: int = 3000) -> tuple[float, int]:
    """SNR of ``decoded`` against ``reference`` after skipping the encoder delay that correlates best."""
    reference = reference.astype(np.float64)
    decoded = decoded.astype(np.float64)
    n = min(len(reference), len(decoded) - max_delay)
    delay = max(range(max_delay + 1), key=lambda lag: float(np.dot(reference[:n], decoded[lag : lag + n])))
    segment = decoded[delay : delay + len(reference)]
    head = reference[: len(segment)]
    return 10 * math.log10(np.sum(head**2) / np.sum((head - segment) ** 2)), delay


def dominant_frequency(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(len(samples)), n=1 << 20))
    return float(np.argmax(spectrum)) * SAMPLE_RATE / (1 << 20)


def test_media_types_are_openais() -> None:
    assert AUDIO_FORMATS == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg; codecs=opus",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
    }
    assert SPEED_RANGE == (0.25, 4.0)


@pytest.mark.parametrize("fmt", ["flac", "wav", "pcm"])
def test_lossless_formats_decode_bit_exact(fmt: str) -> None:
    samples = speech_like()
    decoded = decode(fmt, encode_streamed(fmt, samples))
    assert decoded.shape == samples.shape
    assert np.array_equal(decoded, samples)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_lossy_formats_reproduce_the_signal(fmt: str) -> None:
    samples = speech_like()
    decoded = decode(fmt, encode_streamed(fmt, samples))
    extra = len(decoded) - len(samples)
    assert 0 <= extra <= EXTRA_SAMPLES[fmt], f"{fmt}: {len(decoded)} samples decoded for {len(samples)}"
    snr_db, delay = aligned_snr_db(samples, decoded)
    assert delay <= extra
    assert snr_db > MIN_SNR_DB[fmt], f"{fmt}: SNR {snr_db:.1f} dB after a {delay}-sample delay"


def test_wav_header_is_the_streamed_one_and_pcm_passes_through() -> None:
    pcm = speech_like().astype("<i2").tobytes()
    wav = encode_streamed("wav", speech_like())
    assert wav[:44] == wav_header(UNKNOWN_LENGTH, SAMPLE_RATE)
    assert wav[44:] == pcm
    assert encode_streamed("pcm", speech_like()) == pcm


@pytest.mark.parametrize("fmt", ["flac", "wav", "pcm", "mp3", "opus", "aac"])
def test_streamed_body_equals_one_shot_encode(fmt: str) -> None:
    samples = speech_like()
    one_shot = AudioEncoder(fmt, SAMPLE_RATE)
    whole = one_shot.encode(samples.astype("<i2").tobytes()) + one_shot.finish()
    assert encode_streamed(fmt, samples) == whole


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_compressed_bytes_leave_before_finish(fmt: str) -> None:
    """Bounded memory and latency: most of the body is returned by ``encode``, not held for ``finish``."""
    pieces = stream(AudioEncoder(fmt, SAMPLE_RATE), speech_like(3.0).astype("<i2").tobytes())
    body = sum(len(piece) for piece in pieces)
    assert sum(1 for piece in pieces[:-1] if piece) >= 5
    assert len(pieces[-1]) < body / 2


@pytest.mark.parametrize("speed", [0.5, 2.0, 0.25, 4.0])
@pytest.mark.parametrize("fmt", list(AUDIO_FORMATS))
def test_speed_scales_duration_and_keeps_pitch(fmt: str, speed: float) -> None:
    samples = tone(440.0)
    decoded = decode(fmt, encode_streamed(fmt, samples, speed))
    expected = len(samples) / speed
    extra = EXTRA_SAMPLES[fmt]
    assert expected * 0.97 <= len(decoded) <= expected * 1.03 + extra, f"{len(decoded)} samples, expected {expected}"
    # The middle half: away from the stretch's edges and any codec delay.
    middle = decoded[len(decoded) // 4 : 3 * len(decoded) // 4]
    assert dominant_frequency(middle) == pytest.approx(440.0, rel=0.02)


@pytest.mark.parametrize("speed", [1.0, 0.5, 2.0, 0.25, 4.0, 3.0, 0.3])
def test_atempo_factors_stay_in_range_and_multiply_to_speed(speed: float) -> None:
    factors = atempo_factors(speed)
    assert all(0.5 - 1e-9 <= factor <= 2.0 + 1e-9 for factor in factors)
    assert math.prod(factors) == pytest.approx(speed, rel=1e-9)
    assert len(factors) == math.ceil(abs(math.log2(speed)) - 1e-12)


@pytest.mark.parametrize(
    ("fmt", "speed", "message"),
    [
        ("ogg", 1.0, "response_format must be one of"),
        ("MP3", 1.0, "got 'MP3'"),
        ("mp3", 0.2, "speed must be a number in [0.25, 4.0], got 0.2"),
        ("mp3", 4.5, "got 4.5"),
        ("wav", float("nan"), "got nan"),
        ("pcm", float("inf"), "got inf"),
        ("pcm", "1.0", "got str"),
    ],
)
def test_bad_format_or_speed_is_an_audio_format_error(fmt: str, speed: float, message: str) -> None:
    with pytest.raises(AudioFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AudioEncoder(fmt, SAMPLE_RATE, speed)


def test_range_ends_are_accepted_and_a_finished_encoder_refuses_more() -> None:
    for speed in SPEED_RANGE:
        AudioEncoder("mp3", SAMPLE_RATE, speed)
    encoder = AudioEncoder("pcm", SAMPLE_RATE)
    assert encoder.encode(b"\x01") == b""
    assert encoder.encode(b"\x02\x03") == b"\x01\x02"
    assert encoder.finish() == b""  # the trailing half sample is dropped
    with pytest.raises(RuntimeError, match="finished"):
        encoder.encode(b"\x00\x00")


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
@pytest.mark.parametrize("samples", [1, 240, 480, 1921, 19_200])
def test_any_input_however_short_comes_out_at_its_stretched_length(speed: float, samples: int) -> None:
    """atempo keeps back what does not fill its window; a 20 ms utterance must not come out empty."""
    pcm = (np.sin(np.arange(samples) * 0.05) * 8000).astype("<i2").tobytes()
    encoder = AudioEncoder("pcm", SAMPLE_RATE, speed)
    out = b"".join(encoder.encode(pcm[i : i + 3840]) for i in range(0, len(pcm), 3840)) + encoder.finish()
    assert len(out) // 2 == round(samples / speed)
