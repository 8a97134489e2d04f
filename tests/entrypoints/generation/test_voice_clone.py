"""Voice cloning on a Base checkpoint: vLLM's frames equal the official ``generate_voice_clone``, code for code.

A random-weight Base checkpoint (tiny talker, released-geometry speech tokenizer: 12.5 frames per second
of reference audio, as released) with its speaker encoder and tokenizer encoder; the official qwen-tts
runs in ``.venv-oracle`` on the same directory. Two reference voices (espeak-ng speech at 22.05 kHz,
``tests/fixtures/voices``) x two texts x both modes (in context, x-vector only), alone and batched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vllm_omni.entrypoints.generation.speech import SpeechRequest, SpeechRequestError

from ..oracle import run_oracle

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "voices"
VOICES = {
    "a": ("ref_a_22k.wav", "The quick brown fox jumps over the lazy dog near the river bank."),
    "b": ("ref_b_22k.wav", "She sells sea shells by the sea shore every summer morning."),
}
TEXTS = {"hello": "Hello there, this is a cloned voice.", "morning": "Good morning, how are you today?"}
MODES = ("in_context", "x_vector")
CASES = [(voice, text, mode) for voice in VOICES for text in TEXTS for mode in MODES]
FRAMES = 50


# Beyond the grid: in context with the text given whole, and a 0.6 s reference under a text longer than its
# frames (the streamed text outlasts the reference: the rest is fed per generated step).
LONG_TEXT = "This sentence is a good deal longer than the short reference clip that it is spoken in, on purpose."
EXTRA = {("a", "hello", "whole_text"): (False, True), ("short", "long", "in_context"): (True, False)}


def case_id(case: tuple[str, str, str]) -> str:
    return "-".join(case)


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_omni.entrypoints.generation.reference_decoding import load_reference_audio

    samples = load_reference_audio(FIXTURES / VOICES["b"][0])[: int(0.6 * 24_000)]
    return write_wav(tmp_path_factory.mktemp("short") / "b_short.wav", samples, 24_000)


def extra_request(case: tuple[str, str, str], short_clip: Path) -> dict:
    """The oracle request of an EXTRA case (the same fields for ours)."""
    short, whole = EXTRA[case]
    return {
        "text": LONG_TEXT if short else TEXTS[case[1]],
        "language": "English",
        "non_streaming_mode": whole,
        "max_new_tokens": FRAMES + 1,
        "greedy": True,
        "ref_audio": str(short_clip if short else FIXTURES / VOICES["a"][0]),
        "ref_text": VOICES["b"][1] if short else VOICES["a"][1],
        "x_vector_only_mode": False,
    }


@pytest.fixture(scope="module")
def official(repo_root: Path, base_checkpoint: Path, short_clip: Path, tmp_path_factory) -> dict:
    """The official talker's frames, speaker embedding and reference codes of every case (EXTRA too)."""
    requests = [
        {
            "text": TEXTS[text],
            "language": "English",
            "non_streaming_mode": False,  # generate_voice_clone's default
            "max_new_tokens": FRAMES + 1,
            "greedy": True,
            "ref_audio": str(FIXTURES / VOICES[voice][0]),
            "ref_text": VOICES[voice][1] if mode == "in_context" else None,
            "x_vector_only_mode": mode == "x_vector",
        }
        for voice, text, mode in CASES
    ]
    requests += [extra_request(case, short_clip) for case in EXTRA]
    results = run_oracle(repo_root, base_checkpoint, tmp_path_factory.mktemp("voice-oracle"), requests)
    return dict(zip([*CASES, *EXTRA], results, strict=True))


@pytest.fixture(scope="module")
def generator(base_checkpoint: Path, offline_generator):
    return offline_generator(base_checkpoint)  # shut down with the session's (tests/entrypoints/conftest.py)


@pytest.fixture(scope="module")
def voices(generator) -> dict:
    """Each reference voice in each mode, encoded once (as the server's uploaded voices are)."""
    return {
        (voice, mode): generator.voice_prompt(
            SpeechRequest(
                text=".",
                ref_audio=FIXTURES / VOICES[voice][0],
                ref_text=VOICES[voice][1] if mode == "in_context" else None,
                x_vector_only_mode=mode == "x_vector",
            )
        )
        for voice in VOICES
        for mode in MODES
    }


def cloned(case: tuple[str, str, str], voices: dict) -> SpeechRequest:
    voice, text, mode = case
    return SpeechRequest(
        text=TEXTS[text], language="English", voice=voices[(voice, mode)], max_frames=FRAMES, greedy=True
    )


@pytest.fixture(scope="module")
def alone(generator, voices) -> dict:
    return {case: generator.generate([cloned(case, voices)])[0] for case in CASES}


def test_the_encoders_make_the_official_voice(voices, official):
    for voice, text, mode in CASES:
        result = official[(voice, text, mode)]
        ours = voices[(voice, mode)]
        difference = np.abs(np.asarray(ours.speaker_embedding) - np.asarray(result["speaker_embedding"])).max()
        assert difference <= 1e-4, f"{voice}/{mode}: speaker embedding max abs {difference:.3g}"
        if mode == "x_vector":
            assert ours.reference_codes is None and result["reference_codes"] is None
        else:
            np.testing.assert_array_equal(np.asarray(ours.reference_codes), np.asarray(result["reference_codes"]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_cloned_voice_frames_equal_the_official_talker(case, alone, official):
    ours, theirs = alone[case], np.asarray(official[case]["codes"], dtype=np.int64)
    assert theirs.shape == (FRAMES, 16), "the oracle must produce the frames it is compared on"
    mismatch = np.argwhere(ours != theirs) if ours.shape == theirs.shape else [[-1]]
    assert ours.shape == theirs.shape and len(mismatch) == 0, f"first mismatch at frame/codebook {mismatch[0]}"


@pytest.mark.parametrize("case", list(EXTRA), ids=case_id)
def test_whole_text_and_a_text_longer_than_its_reference_equal_the_official(case, generator, short_clip, official):
    fields = extra_request(case, short_clip)
    voice = generator.voice_prompt(SpeechRequest(text=".", ref_audio=fields["ref_audio"], ref_text=fields["ref_text"]))
    request = SpeechRequest(text=fields["text"], language="English", voice=voice, max_frames=FRAMES, greedy=True,
                            non_streaming_mode=fields["non_streaming_mode"])  # fmt: skip
    ours, theirs = generator.generate([request])[0], np.asarray(official[case]["codes"], dtype=np.int64)
    assert theirs.shape == (FRAMES, 16)
    np.testing.assert_array_equal(ours, theirs)


def test_batched_cloned_voices_equal_each_alone(generator, voices, alone):
    together = generator.generate([cloned(case, voices) for case in CASES])
    for case, frames in zip(CASES, together, strict=True):
        np.testing.assert_array_equal(frames, alone[case], err_msg=case_id(case))


def test_bad_voice_requests_say_what_to_send(generator, voices):
    size = generator.config.talker_config.hidden_size
    wav = FIXTURES / VOICES["a"][0]
    refusals = {
        "ref_text is the transcript of ref_audio": SpeechRequest(text="Hi.", ref_text="words"),
        "needs ref_text": SpeechRequest(text="Hi.", ref_audio=wav),
        f"speaker_embedding must be {size} finite numbers": SpeechRequest(text="Hi.", speaker_embedding=[0.0] * 3),
        "ref_audio: ": SpeechRequest(text="Hi.", ref_audio=b"not audio at all", x_vector_only_mode=True),
        "ref_audio: .*short": SpeechRequest(text="Hi.", ref_audio=(np.zeros(100, np.float32), 24_000), ref_text="a"),
        "give one voice to clone": SpeechRequest(text="Hi.", ref_audio=wav, speaker_embedding=[0.0] * size),
        "no preset speakers": SpeechRequest(text="Hi.", speaker="Ryan", voice=voices[("a", "x_vector")]),
        "clones a voice": SpeechRequest(text="Hi."),
    }
    for expected, request in refusals.items():
        with pytest.raises(SpeechRequestError, match=expected.replace("(", r"\(")):
            generator.build_request(request)
    embedding = list(voices[("a", "x_vector")].speaker_embedding)  # a precomputed embedding: x-vector only
    same = generator.generate([SpeechRequest(text=TEXTS["hello"], language="English", speaker_embedding=embedding,
                                             max_frames=FRAMES, greedy=True)])[0]  # fmt: skip
    np.testing.assert_array_equal(same, generator.generate([cloned(("a", "hello", "x_vector"), voices)])[0])


def write_wav(path: Path, samples: np.ndarray, rate: int) -> Path:
    import wave

    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(rate)
        handle.writeframes(np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2").tobytes())
    return path


def test_the_encoders_equal_the_official_on_16khz_short_and_long_clips(repo_root, base_checkpoint, generator, tmp_path):
    """Speaker embedding within 1e-4 and reference codes equal, through each side's whole audio path: a clip
    recorded at 16 kHz, one shorter than a second, one over ten seconds."""
    import soxr

    from vllm_omni.entrypoints.generation.reference_decoding import load_reference_audio

    a, b = (load_reference_audio(FIXTURES / VOICES[v][0], max_seconds=None) for v in ("a", "b"))  # 24 kHz
    clips = {
        "16khz": write_wav(tmp_path / "a_16k.wav", soxr.resample(a, 24_000, 16_000, quality="HQ"), 16_000),
        "short": write_wav(tmp_path / "b_short.wav", b[: int(0.6 * 24_000)], 24_000),
        "long": write_wav(tmp_path / "ab_long.wav", np.concatenate([a, b, a]), 24_000),
    }
    requests = [
        {"text": "Hi.", "language": "English", "non_streaming_mode": False, "max_new_tokens": 2, "greedy": True,
         "ref_audio": str(path), "ref_text": "Some words.", "x_vector_only_mode": False}
        for path in clips.values()
    ]  # fmt: skip
    results = run_oracle(repo_root, base_checkpoint, tmp_path, requests)
    assert len(np.concatenate([a, b, a])) > 10 * 24_000
    for (name, path), result in zip(clips.items(), results, strict=True):
        ours = generator.voice_prompt(SpeechRequest(text=".", ref_audio=path, ref_text="Some words."))
        difference = np.abs(np.asarray(ours.speaker_embedding) - np.asarray(result["speaker_embedding"])).max()
        assert difference <= 1e-4, f"{name}: speaker embedding max abs {difference:.3g}"
        np.testing.assert_array_equal(np.asarray(ours.reference_codes), np.asarray(result["reference_codes"]), name)
