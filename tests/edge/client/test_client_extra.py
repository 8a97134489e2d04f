"""The `client` extra: a fresh venv with numpy, jsonschema, onnxruntime and the package decodes a CPU plan, no torch.

Installed offline, from the wheels `make setup` keeps in .wheelhouse/ (requirements/client-wheels.txt).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import venv
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.testing.codes import random_codes

CLIENT_PINS = ("numpy==2.4.6", "jsonschema==4.26.0", "onnxruntime==1.31.1")  # the client extra, as CI pins it
DECODE = """
import json, sys
import numpy as np
from vllm_omni.edge.runtime import open_decoder
frames = np.load(sys.argv[2])
decoder = open_decoder(sys.argv[1])
audio = np.concatenate([decoder.feed(frames[:5]), decoder.feed(frames[5:]), decoder.flush()])
np.save(sys.argv[3], audio)
try:
    import torch  # noqa: F401
    torch_importable = True
except ImportError:
    torch_importable = False
print(json.dumps({"torch_loaded": "torch" in sys.modules, "torch_importable": torch_importable,
                  "package": __import__("vllm_omni").__file__}))
"""


def pip(python: Path, wheelhouse: Path, *args: str) -> None:
    """``pip install`` from ``wheelhouse`` only: the suite runs without the network once `make setup` has run."""
    offline = ("--no-index", "--find-links", str(wheelhouse))
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *offline, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_client_extra_decodes_a_cpu_plan_in_a_venv_without_torch(cpu_plan, small_decoder, tmp_path, repo_root):
    wheelhouse = repo_root / ".wheelhouse"
    if not (wheelhouse / ".stamp").exists():
        pytest.fail(f"no client wheels in {wheelhouse}: run `make setup` (make test does)")
    pinned = (repo_root / "requirements" / "client-wheels.txt").read_text()
    assert all(pin in pinned.split() for pin in CLIENT_PINS), "the wheelhouse must hold the pins this test installs"
    environment = tmp_path / "client-venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    pip(python, wheelhouse, *CLIENT_PINS)
    source = tmp_path / "source"  # pip builds in the source tree: keep build/ and *.egg-info out of the repo
    shutil.copytree(repo_root / "vllm_omni", source / "vllm_omni", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo_root / name, source / name)
    pip(python, wheelhouse, "--no-deps", str(source))

    codes = random_codes(13, seed=5)
    frames_path, audio_path = tmp_path / "frames.npy", tmp_path / "audio.npy"
    np.save(frames_path, codes[0].T.numpy())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH: the installed package only
    result = subprocess.run(
        [str(python), "-c", DECODE, str(cpu_plan), str(frames_path), str(audio_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"torch_loaded": False, "torch_importable": False, "package": report["package"]}
    assert report["package"].startswith(str(environment)), report["package"]
    with torch.inference_mode():
        reference = small_decoder(codes)[0, 0].numpy()
    audio = np.load(audio_path)
    assert audio.shape == reference.shape
    assert snr_db(reference, audio) >= 90

    # the device's commands, as installed, in the same venv (where torch cannot be imported): the one script's
    # codec-stream and client subcommands record the frames for the plan, then decode them to a WAV
    script = environment / "bin" / "vllm-omni-edge"
    recording, wav = tmp_path / "frames.qcs", tmp_path / "speech.wav"
    for command in (
        ["codec-stream", "record", "--codes", str(frames_path), "--plan", str(cpu_plan), "--out", str(recording)],
        ["client", "--stream", str(recording), "--plan", str(cpu_plan), "--out", str(wav)],
    ):
        run = subprocess.run(
            [str(script), *command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
        )
        assert run.returncode == 0, f"vllm-omni-edge {command[0]}: {run.stderr[-3000:]}"
    with wave.open(str(wav)) as written:
        assert written.getnframes() == audio.size  # every sample the library decoded
