"""The speech tokenizer's encoder (audio -> reference codes) against the official qwen-tts 0.1.1 encoder.

Runs in the serving venv (the encoder is built from transformers 5's Mimi modules); the official encoder runs
in the oracle venv (transformers 4.57.3) through ``tools/oracle/qwen_tts_oracle.py encode``, which loads the
same random-weight checkpoint strictly. Both get the same 24 kHz float32 arrays: the two voice fixtures
(resampled here with an FFT, for test input only), a 1 s and a 0.3 s clip, and at the released geometry a
13 s clip, longer than Mimi's 10 s attention window. Bar: equal code for code. Numbers go to
``out/test-reports/encoder-parity-<geometry>.json``.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.encoder import (
    SpeechTokenizerEncoder,
    load_speech_tokenizer_encoder,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.encoder_layout import (
    RELEASED_ENCODER_CONFIG,
    SMALL_ENCODER_CONFIG,
    encoder_state_shapes,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.errors import (
    EncoderConfigError,
    EncoderWeightsError,
    InvalidAudioError,
)
from vllm_omni.testing.make_checkpoint import write_checkpoint

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[5]
ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"
ORACLE_SCRIPT = REPO_ROOT / "tools" / "oracle" / "qwen_tts_oracle.py"
VOICES = REPO_ROOT / "tests" / "fixtures" / "voices"
REPORTS = REPO_ROOT / "out" / "test-reports"
SAMPLE_RATE = 24000
MIMI_WINDOW = 250  # Kyutai's attention window in encoder-transformer positions (transformers 5 applies it)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as handle:
        assert handle.getnchannels() == 1 and handle.getsampwidth() == 2
        pcm = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, handle.getframerate()


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling by zero-padding the spectrum: test input only, the same array goes to both."""
    length = round(len(samples) * target / rate)
    spectrum = np.fft.rfft(samples.astype(np.float64))
    padded = np.zeros(length // 2 + 1, dtype=complex)
    keep = min(len(spectrum), len(padded))
    padded[:keep] = spectrum[:keep]
    return (np.fft.irfft(padded, length) * length / len(samples)).astype(np.float32)


def make_clips(geometry: str) -> dict[str, np.ndarray]:
    voices = {name: resample(*read_wav(VOICES / f"{name}_22k.wav"), SAMPLE_RATE) for name in ("ref_a", "ref_b")}
    clips = {
        **voices,
        "one_second": voices["ref_a"][:SAMPLE_RATE].copy(),
        "short_0.3s": voices["ref_b"][: int(0.3 * SAMPLE_RATE)].copy(),
    }
    if geometry == "released":  # 13 s: past the 10 s window (the small geometry's clips all are)
        clips["long_13s"] = np.concatenate([voices["ref_a"], voices["ref_b"], voices["ref_a"]])
    return clips


def run_oracle(speech_tokenizer: Path, clips: dict[str, np.ndarray], workdir: Path) -> dict[str, np.ndarray]:
    if not ORACLE_PYTHON.exists():
        pytest.fail(f"the oracle venv is missing ({ORACLE_PYTHON}); build it with `make setup-oracle`")
    inputs, outputs = workdir / "audio.npz", workdir / "codes.npz"
    np.savez(inputs, **clips)
    command = [str(ORACLE_PYTHON), str(ORACLE_SCRIPT), "encode", "--speech-tokenizer", str(speech_tokenizer)]
    command += ["--inputs", str(inputs), "--out", str(outputs)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    with np.load(outputs) as codes:
        return {name: codes[name] for name in codes.files}


@pytest.fixture(scope="module", params=["small", "released"])
def parity(request, small_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One oracle run and one run of ours per geometry, over the same clips."""
    geometry = request.param
    workdir = tmp_path_factory.mktemp(f"encoder-{geometry}")
    start = time.perf_counter()
    checkpoint = small_checkpoint if geometry == "small" else write_checkpoint(workdir / "ckpt", geometry, seed=0)
    write_seconds = time.perf_counter() - start
    clips = make_clips(geometry)
    start = time.perf_counter()
    official = run_oracle(checkpoint / "speech_tokenizer", clips, workdir)
    oracle_seconds = time.perf_counter() - start
    start = time.perf_counter()
    encoder = load_speech_tokenizer_encoder(checkpoint)
    load_seconds = time.perf_counter() - start
    ours, seconds = {}, {}
    for name, samples in clips.items():
        start = time.perf_counter()
        ours[name] = encoder.encode(samples)
        seconds[name] = time.perf_counter() - start
    report = {
        "geometry": geometry,
        "seconds": {"write_checkpoint": write_seconds, "oracle_process": oracle_seconds, "load": load_seconds},
        "clips": {
            name: {
                "samples": int(clips[name].size),
                "frames": int(ours[name].shape[0]),
                "equal": bool(ours[name].shape == official[name].shape and (ours[name] == official[name]).all()),
                "encode_seconds": seconds[name],
            }
            for name in clips
        },
    }
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"encoder-parity-{geometry}.json").write_text(json.dumps(report, indent=2))
    return {"geometry": geometry, "encoder": encoder, "clips": clips, "official": official, "ours": ours}


def test_codes_equal_the_official_code_for_code(parity):
    for name, expected in parity["official"].items():
        ours = parity["ours"][name]
        assert ours.shape == expected.shape, f"{name}: {ours.shape} vs official {expected.shape}"
        differing = np.argwhere(ours != expected)
        assert differing.size == 0, f"{name}: {len(differing)} codes differ, first at [frame, codebook] {differing[0]}"


def test_codes_are_one_frame_per_samples_per_frame_and_vary_in_every_codebook(parity):
    encoder = parity["encoder"]
    assert (encoder.sample_rate, encoder.num_quantizers) == (SAMPLE_RATE, 16)
    assert encoder.samples_per_frame == {"small": 48, "released": 1920}[parity["geometry"]]
    for name, samples in parity["clips"].items():
        codes = parity["ours"][name]
        assert codes.dtype == np.int64 and codes.shape == (math.ceil(samples.size / encoder.samples_per_frame), 16)
        assert codes.min() >= 0 and codes.max() < 2048
    # Equality would be cheap if every frame got the same code: the random codebooks must make them vary.
    distinct = [len(np.unique(codebook)) for codebook in parity["ours"]["ref_a"].T]
    assert min(distinct) >= 4, f"distinct codes per codebook over ref_a: {distinct}"


def test_attention_spans_the_whole_clip_as_in_the_official_encoder(parity):
    """qwen-tts runs Mimi under transformers 4.57, which ignores Mimi's 250-position window; transformers 5 applies
    it. Ours equals the official on the clips past the window (above), and with the window the codes differ."""
    name = "long_13s" if parity["geometry"] == "released" else "ref_a"
    encoder = parity["encoder"]
    positions = parity["clips"][name].size * 2 // encoder.samples_per_frame  # the transformer runs at twice the rate
    assert positions > MIMI_WINDOW
    window = encoder.config.sliding_window
    try:
        encoder.config.sliding_window = MIMI_WINDOW
        windowed = encoder.encode(parity["clips"][name])
    finally:
        encoder.config.sliding_window = window
    first = MIMI_WINDOW // 2  # frames before this see fewer than 250 positions: identical either way
    assert (windowed[:first] == parity["official"][name][:first]).all()
    assert (windowed[first:] != parity["official"][name][first:]).any()


def test_layout_equals_the_transformers_modules():
    for config in (RELEASED_ENCODER_CONFIG, SMALL_ENCODER_CONFIG):
        encoder = SpeechTokenizerEncoder(config, num_quantizers=16)
        assert {name: tuple(t.shape) for name, t in encoder.state_dict().items()} == encoder_state_shapes(config)


# -- loading ------------------------------------------------------------------------------------------------


def rewrite_weights(source: Path, target: Path, edit) -> Path:
    """A copy of ``source``'s speech tokenizer with its tensors passed through ``edit``."""
    tokenizer = target / "speech_tokenizer"
    tokenizer.mkdir(parents=True)
    (tokenizer / "config.json").write_text((source / "speech_tokenizer" / "config.json").read_text())
    tensors = load_file(source / "speech_tokenizer" / "model.safetensors")
    save_file(edit(tensors), str(tokenizer / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_loads_from_the_checkpoint_or_its_speech_tokenizer_dir(small_checkpoint):
    for path in (small_checkpoint, small_checkpoint / "speech_tokenizer"):
        encoder = load_speech_tokenizer_encoder(path)
        assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: {k: v for k, v in t.items() if k != "encoder.downsample.conv.weight"}, r"missing 1: \['downsample"),
        (lambda t: {**t, "encoder.quantizer.extra": torch.zeros(1)}, r"unexpected 1: \['quantizer.extra'\]"),
        (
            lambda t: {**t, "encoder.encoder.layers.0.conv.weight": torch.zeros(8, 1, 5)},
            r"wrong shape 1: \['encoder.layers.0.conv.weight'\]",
        ),
        # The placeholder encoder half written before the encoder existed.
        (
            lambda t: {
                **{k: v for k, v in t.items() if k.startswith("decoder.")},
                "encoder.encoder.layers.0.conv.weight": torch.zeros(4, 1, 7),
            },
            r"missing 110: .*wrong shape 1",
        ),
    ],
    ids=["missing", "unexpected", "wrong-shape", "placeholder"],
)
def test_loading_is_strict(small_checkpoint, tmp_path, edit, message):
    with pytest.raises(EncoderWeightsError, match=message):
        load_speech_tokenizer_encoder(rewrite_weights(small_checkpoint, tmp_path / "edited", edit))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(encoder_config={}), "no encoder_config"),
        (
            lambda c: c.update(encode_downsample_rate=1920),
            "a frame every 48 samples but encode_downsample_rate is 1920",
        ),
        (lambda c: c["encoder_config"].update(num_hidden_layers=10**6), r"num_hidden_layers must be an integer"),
        (lambda c: c.update(encoder_valid_num_quantizers=8), "differs from the decoder's num_quantizers"),
    ],
    ids=["no-encoder-config", "rate-mismatch", "huge", "quantizers"],
)
def test_bad_encoder_config_is_a_typed_error(small_checkpoint, tmp_path, edit, message):
    checkpoint = rewrite_weights(small_checkpoint, tmp_path / "edited", lambda tensors: tensors)
    config_path = checkpoint / "speech_tokenizer" / "config.json"
    config = json.loads(config_path.read_text())
    edit(config)
    config_path.write_text(json.dumps(config))
    with pytest.raises(EncoderConfigError, match=message):
        load_speech_tokenizer_encoder(checkpoint)


def test_no_speech_tokenizer_is_a_typed_error(tmp_path):
    with pytest.raises(EncoderConfigError, match="no speech tokenizer at"):
        load_speech_tokenizer_encoder(tmp_path)


# -- input contract -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_encoder(small_checkpoint: Path) -> SpeechTokenizerEncoder:
    return load_speech_tokenizer_encoder(small_checkpoint)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (np.zeros(0, np.float32), "audio is empty"),
        (np.array([0.1, np.nan, 0.2], np.float32), "1 NaN or infinite samples"),
        (np.array([0.1, np.inf, -np.inf], np.float32), "2 NaN or infinite samples"),
        (np.zeros(480, np.float64), "float32 samples .* found dtype float64"),
        (np.zeros(480, np.int16), "found dtype int16; convert it"),
        (np.zeros((480, 2), np.float32), r"one mono channel, shape \[samples\], found shape \[480, 2\]"),
        (np.zeros((1, 480), np.float32), r"found shape \[1, 480\]"),
        ([0.0] * 480, "numpy array of float32 samples, found list"),
        (torch.zeros(480), "numpy array of float32 samples, found Tensor"),
        (np.zeros(192001, np.float32), r"at most 8.0 s \(192000 samples at 24000 Hz\)"),
    ],
    ids=["empty", "nan", "inf", "float64", "int16", "stereo", "batch", "list", "tensor", "too-long"],
)
def test_bad_audio_is_a_typed_error(small_encoder, samples, message):
    with pytest.raises(InvalidAudioError, match=message):
        small_encoder.encode(samples)


def test_one_sample_makes_one_frame(small_encoder):
    assert small_encoder.encode(np.full(1, 0.1, np.float32)).shape == (1, 16)


def test_codes_follow_weights_loaded_after_a_first_encode(small_checkpoint):
    """Mimi caches each codebook at its first use; loading new weights must not leave the old codebooks."""
    from vllm_omni.testing.random_encoder_weights import random_encoder_state

    samples = make_clips("small")["one_second"]
    state = random_encoder_state(encoder_state_shapes(SMALL_ENCODER_CONFIG), seed=5)
    fresh = SpeechTokenizerEncoder(SMALL_ENCODER_CONFIG).eval()
    fresh.load_weights(state)
    reloaded = load_speech_tokenizer_encoder(small_checkpoint)
    before = reloaded.encode(samples)
    reloaded.load_weights(state)
    assert (reloaded.encode(samples) == fresh.encode(samples)).all() and (before != fresh.encode(samples)).any()
