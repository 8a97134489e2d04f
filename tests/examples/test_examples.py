"""Every script in examples/ runs as a user would run it (small checkpoints the tests write).

The vLLM examples start an engine or a server each (about 25 s on 2 cores, mostly one core busy): they run two at
a time, started together when the first of them is needed (:func:`vllm_runs`), and each test checks its own run.
"""

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
        [sys.executable, "-m", "vllm_omni.edge", "codec-stream", "record", "--codes", str(tmp_path / "frames.npy"),
         "--plan", str(plan), "--out", str(tmp_path / "s.qcs")],
        check=True, cwd=repo_root, capture_output=True, timeout=300,
    )  # fmt: skip
    out = tmp_path / "speech.wav"
    assert "40 frames" in run_example(repo_root, "decode_on_device.py", "--plan", str(plan), "--stream",
                                      str(tmp_path / "s.qcs"), "--out", str(out))  # fmt: skip
    with torch.inference_mode():
        reference = small_decoder(torch.from_numpy(frames).T[None]).numpy().ravel()
    assert snr_db(float_to_pcm16(reference).astype(np.float64), read_wav(out)) >= 90


# test -> the example and its arguments: {model} the session's talker checkpoint, {base} a Base checkpoint over the
# same speech tokenizer, {voices} the reference recordings, {out} the run's own directory.
VLLM_RUNS = {
    "test_generate_frames_offline": (
        "generate_frames.py", "--model", "{model}", "--text", "Hello there.", "--greedy", "--max-frames", "12",
        "--out", "{out}/frames.npy", "--memory-fraction", "0.1",  # of the RAM, not 0.3: another example runs beside it
    ),
    "test_serve_stream_and_decode_on_loopback": (
        "serve_and_stream.py", "--model", "{model}", "--text", "Hello there.", "--out", "{out}/speech.wav",
        "--artifacts", "{out}/artifacts", "--max-frames", "12",
    ),
    "test_stream_text_piped_into_the_client": (
        "stream_text.py", "--model", "{model}", "--text", "Hello there. How are you?", "--rate", "20",
        "--out", "{out}/speech.wav", "--artifacts", "{out}/artifacts", "--max-frames", "12",
    ),
    # x-vector only: the small test decoder's tokenizer makes 500 frames/s of reference, too many for a prompt.
    "test_clone_a_voice_offline": (
        "clone_voice.py", "--model", "{base}", "--ref-audio", "{voices}/ref_b_22k.wav", "--x-vector-only",
        "--text", "Hello there.", "--text", "And again.", "--greedy", "--max-frames", "12", "--out", "{out}/frames.npy",
        "--kv-cache-bytes", str(64 << 20),
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm_runs(request, repo_root, talker_checkpoint, tmp_path_factory, background_runs):
    """The selected tests' vLLM examples, started two at a time: ``(runs, test name -> the run's directory)``."""
    here = Path(__file__)
    selected = [item.originalname for item in request.session.items if item.path == here]
    runs, directories = background_runs(lanes=2, timeout_s=900), {}
    fields = {"model": talker_checkpoint, "voices": repo_root / "tests" / "fixtures" / "voices"}
    if "test_clone_a_voice_offline" in selected:
        import shutil

        from vllm_omni.testing.talker_checkpoint import write_talker_files

        base = tmp_path_factory.mktemp("examples") / "base"
        shutil.copytree(talker_checkpoint / "speech_tokenizer", base / "speech_tokenizer")
        fields["base"] = write_talker_files(base, "tiny", seed=3, model_type="base")
    for name in (name for name in VLLM_RUNS if name in selected):
        script, *args = VLLM_RUNS[name]
        directories[name] = tmp_path_factory.mktemp("examples")
        arguments = [arg.format(**fields, out=directories[name]) for arg in args]
        runs.add(name, [sys.executable, repo_root / "examples" / script, *arguments], repo_root)
    runs.start()
    return runs, directories


def example_run(vllm_runs, name: str) -> tuple[str, Path]:
    """The standard output and directory of the example run of test ``name``, which must have succeeded."""
    runs, directories = vllm_runs
    result = runs.result(name)
    assert result is not None, f"{name} has no example run"
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, directories[name]


@pytest.mark.vllm
def test_generate_frames_offline(vllm_runs):
    stdout, out = example_run(vllm_runs, "test_generate_frames_offline")
    frames = np.load(out / "frames.npy")
    assert frames.shape == (12, 16) and "12 frames" in stdout


@pytest.mark.vllm
def test_serve_stream_and_decode_on_loopback(vllm_runs):
    _, out = example_run(vllm_runs, "test_serve_stream_and_decode_on_loopback")
    assert read_wav(out / "speech.wav").size == 12 * 48  # 12 frames at the small geometry's 48 samples per frame


def test_stream_text_writes_the_words_as_an_llm_would(repo_root):
    text = "Hello there,  how are you?"
    assert run_example(repo_root, "stream_text.py", "--llm-only", "--text", text, "--rate", "200") == text


@pytest.mark.vllm
def test_stream_text_piped_into_the_client(vllm_runs):
    _, out = example_run(vllm_runs, "test_stream_text_piped_into_the_client")
    # one utterance of 12 frames at the small geometry's 48 samples per frame
    assert read_wav(out / "speech.wav").size == 12 * 48


@pytest.mark.vllm
def test_clone_a_voice_offline(vllm_runs):
    """A Base checkpoint's voice from a reference recording (x-vector only), then frames for two texts."""
    stdout, out = example_run(vllm_runs, "test_clone_a_voice_offline")
    assert "x-vector only" in stdout
    assert [np.load(out / f"frames_{i}.npy").shape for i in (1, 2)] == [(12, 16), (12, 16)]
