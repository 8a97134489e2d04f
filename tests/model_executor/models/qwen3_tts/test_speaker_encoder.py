"""The Base checkpoint's speaker encoder and reference-audio path against the official qwen-tts 0.1.1.

The oracle (``tools/oracle/qwen_tts_talker_oracle.py speaker-embedding``, in .venv-oracle) loads the same
random-weight tiny Base checkpoint strictly and runs ``create_voice_clone_prompt`` (x-vector mode) on the
two 22.05 kHz reference voices (librosa.load + librosa.resample), on voice A taken to 24 kHz once with
soxr here and given as a ``(samples, 24000)`` array (no resampling), and on a stereo 24 kHz WAV of it
(downmix only). Bar: the embedding within 1e-4 max-abs. Measured numbers are written to
``out/test-reports/speaker-encoder.json``. (The official ``(samples, sr)`` input crashes on a 2-D array
in qwen-tts 0.1.1, so stereo goes through a file.)
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.audio_files import encoded
from vllm_omni.entrypoints.generation.reference_decoding import load_reference_audio
from vllm_omni.model_executor.models.qwen3_tts.reference_audio import (
    SPEAKER_MEL,
    ReferenceAudioError,
    slaney_mel_filterbank,
    speaker_mel,
)
from vllm_omni.model_executor.models.qwen3_tts.speaker_encoder import SpeakerEncoderError, load_speaker_encoder
from vllm_omni.testing.talker_checkpoint import write_talker_files

pytestmark = pytest.mark.vllm  # the serving venv: transformers, PyAV and soxr (tests/conftest.py)

REPO_ROOT = Path(__file__).resolve().parents[4]
ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"
ORACLE_SCRIPT = REPO_ROOT / "tools" / "oracle" / "qwen_tts_talker_oracle.py"
VOICES = REPO_ROOT / "tests" / "fixtures" / "voices"
REPORTS = REPO_ROOT / "out" / "test-reports"
TOLERANCE = 1e-4
INPUTS = ("ref_a_22k.wav", "ref_b_22k.wav", "ref_a_24k.npz", "ref_a_24k_stereo.wav")


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """16-bit mono PCM as float32 in [-1, 1) (libsndfile's scaling), with its rate."""
    with wave.open(str(path)) as handle:
        assert (handle.getsampwidth(), handle.getnchannels()) == (2, 1)
        pcm = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, handle.getframerate()


def write_24k_inputs(workdir: Path) -> None:
    """Voice A taken to 24 kHz once with soxr: mono float32 in an .npz, and a 16-bit WAV whose two channels
    differ (the voice and its reverse at half level)."""
    import soxr

    samples, rate = read_wav(VOICES / "ref_a_22k.wav")
    at_24k = soxr.resample(samples, rate, 24000, quality="HQ")
    np.savez(workdir / "ref_a_24k.npz", samples=at_24k, sample_rate=np.int64(24000))
    stereo = np.stack([at_24k, 0.5 * at_24k[::-1]], axis=1)
    with wave.open(str(workdir / "ref_a_24k_stereo.wav"), "wb") as handle:
        handle.setnchannels(2)
        handle.setsampwidth(2)
        handle.setframerate(24000)
        handle.writeframes(np.round(np.clip(stereo, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())


def input_path(name: str, workdir: Path) -> Path:
    return VOICES / name if (VOICES / name).exists() else workdir / name


def our_input(name: str, workdir: Path) -> object:
    if name.endswith(".npz"):
        with np.load(workdir / name) as arrays:
            return arrays["samples"], int(arrays["sample_rate"])
    return input_path(name, workdir)


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_talker_files(tmp_path_factory.mktemp("base") / "tiny-base", "tiny", seed=0, model_type="base")


@pytest.fixture(scope="module")
def oracle(base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], Path]:
    if not ORACLE_PYTHON.exists():
        pytest.fail(f"the oracle venv is missing ({ORACLE_PYTHON}); build it with `make setup-oracle`")
    workdir = tmp_path_factory.mktemp("speaker-oracle")
    write_24k_inputs(workdir)
    audio = [str(input_path(name, workdir)) for name in INPUTS]
    out = workdir / "oracle.npz"
    command = [str(ORACLE_PYTHON), str(ORACLE_SCRIPT), "speaker-embedding", "--checkpoint", str(base_checkpoint)]
    completed = subprocess.run(
        [*command, "--audio", *audio, "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    with np.load(out) as arrays:
        return {name: arrays[name] for name in arrays.files}, workdir


@pytest.fixture(scope="module")
def report():
    numbers: dict[str, object] = {"tolerance": TOLERANCE}
    yield numbers
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "speaker-encoder.json").write_text(json.dumps(numbers, indent=2) + "\n")


@pytest.mark.oracle
@pytest.mark.parametrize("index", range(len(INPUTS)), ids=INPUTS)
def test_speaker_embedding_equals_the_official(index, base_checkpoint, oracle, report):
    official, workdir = oracle
    encoder = load_speaker_encoder(base_checkpoint)
    samples = load_reference_audio(our_input(INPUTS[index], workdir))
    expected_samples = official[f"samples_24k_{index}"]
    assert samples.dtype == np.float32 and samples.shape == expected_samples.shape

    mels = speaker_mel(samples)
    embedding = encoder.embed(samples)
    expected = torch.from_numpy(official[f"embedding_{index}"])
    numbers = {
        "samples_24k_max_abs": float(np.abs(samples - expected_samples).max()),
        "mel_max_abs": float((mels - torch.from_numpy(official[f"mel_{index}"])).abs().max()),
        "embedding_max_abs": float((embedding - expected).abs().max()),
        "embedding_peak": float(expected.abs().max()),
        "frames": mels.shape[0],
    }
    report[INPUTS[index]] = numbers
    assert embedding.shape == expected.shape == (encoder.config.enc_dim,)
    assert numbers["samples_24k_max_abs"] <= 1e-6, numbers  # the same soxr "HQ" and length fix as librosa
    assert numbers["mel_max_abs"] <= TOLERANCE, numbers
    assert numbers["embedding_max_abs"] <= TOLERANCE, numbers


@pytest.mark.oracle
def test_the_voices_have_embeddings_far_apart_compared_with_the_bar(oracle, report):
    official, _ = oracle
    apart = float(np.abs(official["embedding_0"] - official["embedding_1"]).max())
    report["voices_a_b_max_abs"] = apart
    assert apart > 100 * TOLERANCE, "the random encoder must tell the voices apart for the bar to mean anything"


@pytest.mark.oracle
def test_mel_filterbank_equals_librosa(oracle, report):
    official, _ = oracle
    ours = slaney_mel_filterbank(
        SPEAKER_MEL.sample_rate, SPEAKER_MEL.n_fft, SPEAKER_MEL.n_mels, SPEAKER_MEL.fmin, SPEAKER_MEL.fmax
    )
    assert ours.shape == official["mel_basis"].shape == (128, 513) and ours.dtype == np.float32
    report["mel_filterbank_max_abs"] = float(np.abs(ours - official["mel_basis"]).max())
    assert report["mel_filterbank_max_abs"] <= 1e-6


def test_a_bytes_source_and_a_flac_decode_to_the_same_samples_as_the_path():
    import av

    from_path = load_reference_audio(VOICES / "ref_a_22k.wav")
    wav_bytes = (VOICES / "ref_a_22k.wav").read_bytes()
    np.testing.assert_array_equal(load_reference_audio(wav_bytes), from_path)

    samples, rate = read_wav(VOICES / "ref_a_22k.wav")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(
            np.round(samples * 32768).astype(np.int16)[None], format="s16", layout="mono"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    np.testing.assert_array_equal(load_reference_audio(buffer.getvalue()), from_path)


def copy_with_speaker_state(source: Path, target: Path, edit) -> Path:
    """``source``'s config and a model.safetensors of its tensors after ``edit(state)``."""
    from safetensors.torch import load_file, save_file

    target.mkdir()
    shutil.copy(source / "config.json", target / "config.json")
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file(state, str(target / "model.safetensors"))
    return target


def test_only_speaker_encoder_tensors_are_loaded_and_they_must_match_exactly(base_checkpoint, tmp_path):
    def drop(state):
        del state["speaker_encoder.blocks.1.res2net_block.blocks.6.conv.bias"]

    def extra(state):
        state["speaker_encoder.blocks.9.conv.weight"] = torch.zeros(4, 4, 1)

    def reshape(state):
        state["speaker_encoder.fc.weight"] = state["speaker_encoder.fc.weight"][:, :-1].contiguous()

    def talker_only(state):
        for name in [name for name in state if name.startswith("speaker_encoder.")]:
            del state[name]

    encoder = load_speaker_encoder(base_checkpoint)
    assert encoder.fc.weight.dtype == torch.float32 and not encoder.training
    cases = [
        (drop, r"missing \(1\): speaker_encoder\.blocks\.1\.res2net_block\.blocks\.6\.conv\.bias"),
        (extra, r"unexpected \(1\): speaker_encoder\.blocks\.9\.conv\.weight"),
        (
            reshape,
            r"shape mismatch \(1\): speaker_encoder\.fc\.weight: found \(128, 383, 1\), expected \(128, 384, 1\)",
        ),
        (talker_only, r"missing \(76\)"),
    ]
    for index, (edit, message) in enumerate(cases):
        broken = copy_with_speaker_state(base_checkpoint, tmp_path / str(index), edit)
        with pytest.raises(SpeakerEncoderError, match=message):
            load_speaker_encoder(broken)


def test_a_checkpoint_without_a_speaker_encoder_or_with_the_wrong_width_is_refused(base_checkpoint, tmp_path):
    config = json.loads((base_checkpoint / "config.json").read_text())
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(json.dumps({**config, "tts_model_type": "custom_voice"}))
    with pytest.raises(SpeakerEncoderError, match="not a Base .*tts_model_type='custom_voice'"):
        load_speaker_encoder(custom)

    narrow = tmp_path / "narrow"
    narrow.mkdir()
    config["speaker_encoder_config"]["enc_dim"] = 64
    (narrow / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpeakerEncoderError, match="enc_dim=64 differs from talker_config.hidden_size=128"):
        load_speaker_encoder(narrow)


VOICE_A = VOICES / "ref_a_22k.wav"


@pytest.mark.parametrize(
    ("source", "max_seconds", "message"),
    [
        (b"", 60.0, "the audio bytes are not an accepted audio file: reference audio must be WAV, FLAC, MP3 or OGG"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt garbage" * 8, 60.0, "could not be decoded as audio"),
        (VOICE_A, 1.0, r"too long: more than 1\.\d+ s at 22050 Hz, at most 1 s taken"),
        (VOICE_A.read_bytes(), 2.5, "too long: .* at most 2.5 s taken"),
        ((np.zeros(30 * 16000, np.float32), 16000), 20.0, "too long: more than 30.00 s at 16000 Hz"),
        ((np.zeros(0, np.float32), 24000), 60.0, "empty: expected at least one sample"),
        ((np.array([0.1, np.nan, np.inf], np.float32), 24000), 60.0, "2 non-finite samples .*expected finite"),
        ((np.zeros(100, np.int16), 24000), 60.0, r"floats in \[-1, 1\], found dtype int16 \(divide int16 PCM"),
        ((np.zeros((2, 3, 4), np.float32), 24000), 60.0, r"shaped \(n,\) or \(n, channels\), found \(2, 3, 4\)"),
        ((np.zeros(100, np.float32), 0), 60.0, "sample_rate must be a whole number of Hz .* found 0"),
        ((np.zeros(100, np.float32), 22050.5), 60.0, "found 22050.5"),
        (VOICES / "missing.wav", 60.0, "missing.wav does not exist"),
        ([0.0, 0.1], 60.0, r"audio file bytes, a path, or \(numpy samples, sample_rate\); found list"),
    ],
    ids=[
        "empty-bytes",
        "garbage-bytes",
        "too-long-path",
        "too-long-bytes",
        "too-long-array",
        "empty-array",
        "non-finite",
        "integer-samples",
        "three-dims",
        "zero-rate",
        "fractional-rate",
        "missing-file",
        "wrong-type",
    ],
)
def test_unusable_reference_audio_is_a_reference_audio_error(source, max_seconds, message):
    with pytest.raises(ReferenceAudioError, match=message):
        load_reference_audio(source, max_seconds=max_seconds)


def test_only_the_named_containers_are_opened_and_nothing_they_name(tmp_path, monkeypatch):
    """A playlist, a concat script, a file naming a URL or raw PCM: refused before any demuxer runs, naming the
    accepted formats; the file and the socket they name are never opened."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/voice.wav"
    shutil.copy(VOICE_A, tmp_path / "named.wav")
    monkeypatch.chdir(tmp_path)  # a concat script's relative file would resolve here
    hostile = {
        "hls": f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{url}\n#EXT-X-ENDLIST\n".encode(),
        "concat": b"ffconcat version 1.0\nfile named.wav\n",
        "url_file": f"[playlist]\nFile1={url}\nNumberOfEntries=1\n".encode(),
        "raw_pcm": np.zeros(24_000, np.int16).tobytes(),
    }
    for name, data in hostile.items():
        with pytest.raises(ReferenceAudioError, match="must be WAV, FLAC, MP3 or OGG"):
            load_reference_audio(data)
        (tmp_path / f"{name}.bin").write_bytes(data)
        with pytest.raises(ReferenceAudioError, match="must be WAV, FLAC, MP3 or OGG"):
            load_reference_audio(tmp_path / f"{name}.bin")
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing connected
    listener.close()
    assert len(load_reference_audio(tmp_path / "named.wav")) > 0  # a real WAV still decodes


def test_audio_shorter_than_the_encoder_needs_is_a_reference_audio_error(base_checkpoint):
    encoder = load_speaker_encoder(base_checkpoint)
    assert encoder.min_frames == 5  # kernel 3 at dilation 4 pads 4 frames by reflection
    with pytest.raises(ReferenceAudioError, match="300 samples at 24000 Hz, at least 385 needed"):
        encoder.embed(np.zeros(300, np.float32))
    with pytest.raises(
        ReferenceAudioError, match="4 feature frames, the speaker encoder needs at least 5 .1280 samples"
    ):
        encoder.embed(np.zeros(1279, np.float32))
    assert encoder.embed(np.zeros(1280, np.float32)).shape == (128,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("wav", "adpcm_ms", 24000, 1, 0.5),
            "coded as 'adpcm_ms'; reference audio takes PCM, FLAC, MP3, Vorbis or Opus",
        ),
        (("flac", "flac", 384000, 8, 0.05), "have 8 channels; reference audio takes mono or stereo"),
        (("wav", "pcm_s16le", 24000, 3, 0.1), "have 3 channels"),
        (("flac", "flac", 96000, 1, 0.1), "sampled at 96000 Hz; reference audio takes at most 48000 Hz"),
    ],
    ids=["adpcm-wav", "flac-8ch-384k", "wav-3ch", "flac-96k"],
)
def test_reference_audio_of_other_codecs_channels_or_rates_is_refused_before_decoding(args, message):
    with pytest.raises(ReferenceAudioError, match=message):
        load_reference_audio(encoded(*args))


def test_mono_and_stereo_pcm_and_flac_up_to_48k_are_taken():
    for args in (
        ("wav", "pcm_s16le", 48000, 2, 0.2),
        ("flac", "flac", 44100, 1, 0.2),
        ("wav", "pcm_s16le", 8000, 1, 0.2),
    ):
        samples = load_reference_audio(encoded(*args))
        assert samples.dtype == np.float32 and abs(samples.size - 0.2 * 24000) <= 2, (args, samples.size)
