"""The board-side RKNN runner, with a stand-in for rknn-toolkit-lite2 (we do not ship a board).

The stand-in ``rknnlite.api.RKNNLite`` runs the ``.rknn``'s ONNX source in onnxruntime, so the
test checks what is ours: the plan's contract reaches the runner, inputs go in the contract's
order, outputs are checked, and the stream decodes exactly.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import float_to_pcm16, snr_db
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.plan import ExecPlan, StepArtifact, stateful_plan
from vllm_omni.edge.runtime.open import open_decoder
from vllm_omni.testing.codes import random_codes

from ...plugin_package import install_modules

FAKE_RKNNLITE = """
from pathlib import Path
import onnxruntime

CALLS = []
LOADS = []

class RKNNLite:
    def load_rknn(self, path):
        LOADS.append(Path(path).name)
        source = Path(path).with_suffix(".onnx")
        if Path(path).read_bytes() != b"rknn:" + source.name.encode():
            return -1
        self.session = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        return 0

    def init_runtime(self, core_mask=None):
        return 0

    def inference(self, inputs):
        CALLS.append([x.shape for x in inputs])
        names = [i.name for i in self.session.get_inputs()]
        return self.session.run(None, dict(zip(names, inputs)))

    def release(self):
        pass
"""


@pytest.fixture
def board_plan(cpu_plan, tmp_path, monkeypatch):
    """A rockchip_npu plan whose .rknn files the stand-in board runtime understands."""
    package = tmp_path / "site" / "rknnlite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "api.py").write_text(FAKE_RKNNLITE)
    install_modules(monkeypatch, {"rknnlite": package / "__init__.py", "rknnlite.api": package / "api.py"})
    source = ExecPlan.load(cpu_plan)
    directory = tmp_path / "plan"
    directory.mkdir()
    steps = {}
    for role in source.artifacts:
        onnx = Path(shutil.copy(source.path(role), directory))
        rknn = directory / source.artifacts[role].file.replace(".onnx", ".rknn")
        rknn.write_bytes(b"rknn:" + source.artifacts[role].file.encode())
        steps[role] = StepArtifact(path=rknn, contract=source.step_contract(role), source=directory / onnx.name)
    plan = stateful_plan(
        hardware_class="rockchip_npu", backend="rknn", dtype="fp16", model={"id": "test"},
        directory=directory, steps=steps, target="rk3588",
    )  # fmt: skip
    plan.write(directory)
    return directory


def test_the_board_runner_decodes_a_stream_through_the_plan(board_plan, small_decoder):
    frames = random_codes(13, 16, 2048, seed=4)[0].T.numpy().copy()
    decoder = open_decoder(board_plan, rknn_runtime="board")
    audio = np.concatenate([decoder.feed(frames[:7]), decoder.feed(frames[7:]), decoder.flush()])
    with torch.inference_mode():
        reference = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    assert snr_db(reference, audio) >= 90
    from rknnlite.api import CALLS

    assert CALLS[0] == [(1, 16, 2), (2, 16), (1,), (7808,)]  # first step B=2, in the contract's order
    assert CALLS[1] == [(1, 16, 4), (4, 16), (1,), (7808,)]


def test_roles_naming_one_rknn_share_one_loaded_model(board_plan):
    """One .rknn for both step sizes (dynamic_input) is loaded once: one copy of the weights on the board;
    each role's inputs carry its B, which is how rknnlite picks the compiled shape set."""
    plan = ExecPlan.load(board_plan)
    assert plan.artifacts["first"].file == plan.artifacts["main"].file
    decoder = open_decoder(board_plan, rknn_runtime="board")
    from rknnlite.api import LOADS

    assert len(LOADS) == 1 and LOADS[0] == plan.artifacts["main"].file
    assert decoder.first.model is decoder.main.model
    assert (decoder.first.contract.step_frames, decoder.main.contract.step_frames) == (2, 4)


def test_auto_picks_the_board_runtime_when_rknnlite_is_installed(board_plan):
    decoder = open_decoder(board_plan)
    assert type(decoder.main).__name__ == "RknnLiteStepRunner"


def test_a_file_the_board_runtime_cannot_load_is_a_clear_error(board_plan):
    plan = ExecPlan.load(board_plan)
    with pytest.raises(EdgeError, match="rknnlite could not load .*built for this SoC"):
        from vllm_omni.edge.backends.rknn.run import RknnLiteStepRunner

        (board_plan / "junk.rknn").write_bytes(b"junk")
        RknnLiteStepRunner(board_plan / "junk.rknn", plan.step_contract("main"))


def test_the_board_loop_example_decodes_a_recording(board_plan, small_decoder, repo_root, tmp_path):
    """examples/decode_on_device.py --rknn-runtime board: the loop a Rockchip board runs, on the stand-in."""
    import os
    import subprocess
    import wave

    frames = random_codes(13, 16, 2048, seed=5)[0].T.numpy().copy()
    np.save(tmp_path / "frames.npy", frames)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(repo_root)])}
    record = [sys.executable, "-m", "vllm_omni.edge", "codec-stream", "record", "--codes", str(tmp_path / "frames.npy")]
    record += ["--plan", str(board_plan), "--out", str(tmp_path / "s.qcs")]
    subprocess.run(record, check=True, capture_output=True, env=env, timeout=300)
    example = [sys.executable, str(repo_root / "examples" / "decode_on_device.py"), "--plan", str(board_plan)]
    example += ["--stream", str(tmp_path / "s.qcs"), "--out", str(tmp_path / "b.wav"), "--rknn-runtime", "board"]
    run = subprocess.run(example, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with wave.open(str(tmp_path / "b.wav")) as handle:
        heard = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2").astype(np.float64)
    with torch.inference_mode():
        reference = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    assert snr_db(float_to_pcm16(reference).astype(np.float64), heard) >= 90
