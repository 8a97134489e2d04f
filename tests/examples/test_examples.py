"""Every script in examples/ runs as a user would run it (small checkpoints the tests write)."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.audio import float_to_pcm16, snr_db


def run_example(repo_root: Path, script: str, *args: str, timeout: int = 900) -> str:
    result = subprocess.run(
        [sys.executable, str(repo_root / "examples" / script), *args],
        cwd=repo_root, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as handle:
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2").astype(np.float64)


def test_build_a_plan_then_decode_a_recording_on_the_device(repo_root, small_checkpoint, small_decoder, tmp_path):
    import torch

    plan = tmp_path / "cpu_x86_64"
    assert "cpu_x86_64" in run_example(repo_root, "build_plan.py", "--model", str(small_checkpoint), "--out", str(plan))
    frames = np.random.default_rng(3).integers(0, 2048, size=(40, 16))
    np.save(tmp_path / "frames.npy", frames)
    subprocess.run(
        [sys.executable, "-m", "vllm_omni.edge.codec_stream", "record", "--codes", str(tmp_path / "frames.npy"),
         "--plan", str(plan), "--out", str(tmp_path / "s.qcs")],
        check=True, cwd=repo_root, capture_output=True, timeout=300,
    )  # fmt: skip
    out = tmp_path / "speech.wav"
    assert "40 frames" in run_example(repo_root, "decode_on_device.py", "--plan", str(plan), "--stream",
                                      str(tmp_path / "s.qcs"), "--out", str(out))  # fmt: skip
    with torch.inference_mode():
        reference = small_decoder(torch.from_numpy(frames).T[None]).numpy().ravel()
    assert snr_db(float_to_pcm16(reference).astype(np.float64), read_wav(out)) >= 90


@pytest.mark.vllm
def test_generate_frames_offline(repo_root, talker_checkpoint, tmp_path):
    out = tmp_path / "frames.npy"
    stdout = run_example(repo_root, "generate_frames.py", "--model", str(talker_checkpoint), "--text", "Hello there.",
                         "--greedy", "--max-frames", "12", "--out", str(out))  # fmt: skip
    frames = np.load(out)
    assert frames.shape == (12, 16) and "12 frames" in stdout


@pytest.mark.vllm
def test_serve_stream_and_decode_on_loopback(repo_root, talker_checkpoint, tmp_path):
    out = tmp_path / "speech.wav"
    run_example(repo_root, "serve_and_stream.py", "--model", str(talker_checkpoint), "--text", "Hello there.",
                "--out", str(out), "--artifacts", str(tmp_path / "artifacts"), "--max-frames", "12")  # fmt: skip
    assert read_wav(out).size == 12 * 48  # 12 frames at the small geometry's 48 samples per frame


def test_stream_text_writes_the_words_as_an_llm_would(repo_root):
    text = "Hello there,  how are you?"
    assert run_example(repo_root, "stream_text.py", "--llm-only", "--text", text, "--rate", "200") == text


@pytest.mark.vllm
def test_stream_text_piped_into_the_client(repo_root, talker_checkpoint, tmp_path):
    out = tmp_path / "speech.wav"
    run_example(repo_root, "stream_text.py", "--model", str(talker_checkpoint), "--text", "Hello there. How are you?",
                "--rate", "20", "--out", str(out), "--artifacts", str(tmp_path / "artifacts"),
                "--max-frames", "12")  # fmt: skip
    assert read_wav(out).size == 12 * 48  # one utterance of 12 frames at the small geometry's 48 samples per frame


@pytest.mark.vllm
def test_clone_a_voice_offline(repo_root, talker_checkpoint, tmp_path):
    """x-vector only: the small test decoder's tokenizer makes 500 frames/s of reference, too many for a prompt."""
    import shutil

    from vllm_omni.edge.testing.talker_checkpoint import write_talker_files

    base = tmp_path / "base"
    shutil.copytree(talker_checkpoint / "speech_tokenizer", base / "speech_tokenizer")
    write_talker_files(base, "tiny", seed=3, model_type="base")
    out = tmp_path / "frames.npy"
    reference = repo_root / "tests" / "fixtures" / "voices" / "ref_b_22k.wav"
    stdout = run_example(repo_root, "clone_voice.py", "--model", str(base), "--ref-audio", str(reference),
                         "--x-vector-only", "--text", "Hello there.", "--text", "And again.", "--greedy",
                         "--max-frames", "12", "--out", str(out), "--kv-cache-bytes", str(64 << 20))  # fmt: skip
    assert "x-vector only" in stdout
    assert [np.load(tmp_path / f"frames_{i}.npy").shape for i in (1, 2)] == [(12, 16), (12, 16)]
