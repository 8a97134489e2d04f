"""`vllm-omni-edge rknn-convert`, ONNX half (the main venv)."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
CONVERTER = ("-m", "vllm_omni.edge", "rknn-convert")


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, *CONVERTER, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=600,
    )


def test_skip_rknn_exports_a_checked_step_graph_and_check_only_rechecks_it(small_checkpoint, tmp_path):
    import os

    env = {**os.environ, "QWEN3_TTS_MODEL": str(small_checkpoint)}
    output = tmp_path / "step_b4.onnx"
    result = run("--codes-length", 4, "--skip-rknn", "--output", output, env=env)
    assert result.returncode == 0, result.stderr
    assert "B=4 N=7808 head_dim=32" in result.stdout
    assert "onnxruntime stepwise vs full decode" in result.stderr
    result = run("--model-dir", small_checkpoint, "--codes-length", 4, "--check-only", "--output", output)
    assert result.returncode == 0 and "dB" in result.stdout, result.stderr


def test_missing_model_and_unknown_target_fail_in_one_line(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "QWEN3_TTS_MODEL"}
    result = run("--skip-rknn", "--output", tmp_path / "x.onnx", env=env)
    assert result.returncode == 2 and "set QWEN3_TTS_MODEL" in result.stderr
    result = run("--target", "rk9999", "--output", tmp_path / "x.onnx")
    assert result.returncode == 2 and "invalid choice: 'rk9999'" in result.stderr


def test_a_build_with_register_overflow_fails_unless_allowed(small_decoder, tmp_path, monkeypatch):
    """The REGTASK gate, without the toolkit: a fake engine reports 3 warnings on the main graph."""
    import json

    import pytest

    from vllm_omni.edge.backends.rknn.convert import EngineReport
    from vllm_omni.edge.builders.onnx.steps import export_checked_step
    from vllm_omni.edge.builders.rknn import convert as rknn_convert

    graph = export_checked_step(small_decoder, 4, tmp_path / "step_b4.onnx", graph_layout="time_on_height")

    class FakeEngine:
        def __init__(self, output):
            output.write_bytes(b"rknn")
            self.report = EngineReport(
                str(output), "rk3588", 4, "0" * 64, "fake", build_seconds=1.0, regtask_warnings=3
            )

        def release(self):
            pass

    monkeypatch.setattr(rknn_convert, "build_engine", lambda onnx_path, output, **_: FakeEngine(output))
    monkeypatch.setattr(rknn_convert, "simulator_check", lambda *_: {"passed": True, "verdict": "fake"})
    request = rknn_convert.ConvertRequest(output=tmp_path / "step_b4.rknn", onnx=graph)
    with pytest.raises(rknn_convert.RegisterOverflowError, match="expected 0, found main: 3") as caught:
        rknn_convert.compile_and_check(request, {"main": graph}, None)
    assert "--allow-register-overflow" in str(caught.value)
    report = json.loads(caught.value.report_path.read_text())
    assert report["regtask_warnings"] == {"main": 3} and report["graph_layout"] == {"main": "time_on_height"}
    assert not (tmp_path / "exec_plan.json").exists()


def test_a_converter_killed_by_a_signal_is_named():
    from vllm_omni.edge.builders.rknn.build import died_how

    assert died_how(-4) == "rknn-toolkit2 crashed (SIGILL); its build log says how far it got"
    assert "SIGKILL; out of memory?" in died_how(-9) and died_how(2) == "exit code 2"


def test_a_dynamic_graph_compiles_once_for_both_step_sizes_and_both_roles_name_it(small_decoder, tmp_path, monkeypatch):
    """--dynamic-input, without the toolkit: one build_engine call with a shape set per step size, one .rknn
    that the plan's first and main roles both name, each with its own B."""
    from vllm_omni.edge.backends.rknn.convert import EngineReport
    from vllm_omni.edge.builders.onnx.steps import export_checked_step
    from vllm_omni.edge.builders.rknn import convert as rknn_convert
    from vllm_omni.edge.plan import ExecPlan

    graph = export_checked_step(
        small_decoder, 4, tmp_path / "step_b2_b4.onnx", graph_layout="time_on_height", form="npu_dynamic",
        first_step_frames=2,
    )  # fmt: skip
    builds = []

    class FakeEngine:
        def __init__(self, onnx_path, output, shape_sets):
            builds.append((onnx_path.name, output.name, shape_sets))
            output.write_bytes(b"rknn")
            self.report = EngineReport(
                str(output), "rk3588", 4, "0" * 64, "fake", build_seconds=1.0, regtask_warnings=0
            )
            self.report.shape_sets = shape_sets

        def release(self):
            pass

    check = {"passed": True, "verdict": "fake", "frames": 72, "steps": [2, 4], "per_step_snr_db": [60.0]}
    check |= {"min_step_snr_db": 60.0, "mean_step_snr_db": 60.0, "snr_db_vs_onnxruntime": 60.0}
    monkeypatch.setattr(
        rknn_convert,
        "build_engine",
        lambda onnx_path, output, shape_sets=None, **_: FakeEngine(onnx_path, output, shape_sets),
    )
    monkeypatch.setattr(rknn_convert, "simulator_check", lambda *_: check)
    request = rknn_convert.ConvertRequest(
        output=tmp_path / "step_b2_b4.rknn", onnx=graph, first_codes_length=2, dynamic_input=True
    )
    result = rknn_convert.compile_and_check(request, {"main": graph}, None)
    assert len(builds) == 1 and builds[0][:2] == ("step_b2_b4.onnx", "step_b2_b4.rknn")
    assert [[list(shape) for shape in shapes] for shapes in builds[0][2]] == [
        [[1, 16, 2], [2, 16], [1], [7808]],
        [[1, 16, 4], [4, 16], [1], [7808]],
    ]
    plan = ExecPlan.load(tmp_path)
    assert plan.artifacts["first"].file == plan.artifacts["main"].file == "step_b2_b4.rknn"
    assert (plan.step_contract("first").step_frames, plan.step_contract("main").step_frames) == (2, 4)
    assert plan.build["dynamic_input"] == {"step_b2_b4.rknn": [2, 4]} and result.plan_path.is_file()


def test_the_simulator_gate_judges_a_near_silent_decode_against_full_scale(
    near_silent_checkpoint, small_decoder, tmp_path, monkeypatch
):
    """Issue 26, the fp16 gate without the toolkit: the "simulator" is onnxruntime plus noise of a set RMS.

    Against a decode of RMS ~1e-8, noise at 1e-4 (about -70 dBFS peak) is far under the -40 dBFS that a
    full-scale signal at the 40 dB bar may carry: it passes though its SNR is negative. Noise at 0.05
    fails against it, and noise at 1e-2 fails against a loud decode (about 17 dB SNR).
    """
    import numpy as np

    from vllm_omni.edge.backends.onnx.export import export_step_onnx
    from vllm_omni.edge.backends.onnx.graph import graph_contract
    from vllm_omni.edge.backends.onnx.run import OnnxStepGraph
    from vllm_omni.edge.builders.rknn import check as rknn_check
    from vllm_omni.edge.builders.rknn import convert as rknn_convert
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    noise = {"rms": 0.0}

    class NoisySimulator:
        def __init__(self, path, contract, target, engine=None):
            self.onnxruntime = OnnxStepGraph(path).runner(contract.step_frames)
            self.rng = np.random.default_rng(0)

        def run(self, codes, freqs, cache_valid, cache):
            audio, cache = self.onnxruntime.run(codes, freqs, cache_valid, cache)
            return audio + (noise["rms"] * self.rng.standard_normal(audio.shape)).astype(np.float32), cache

    monkeypatch.setattr(rknn_check, "RknnSimulatorStepRunner", NoisySimulator)
    monkeypatch.setattr(rknn_check, "analyse_accuracy", lambda *_: {})
    request = rknn_convert.ConvertRequest(output=tmp_path / "x.rknn", check_steps=4)

    def check(decoder, name: str, rms: float) -> dict:
        graph = export_step_onnx(decoder, 4, tmp_path / f"{name}.onnx")
        noise["rms"] = rms
        return rknn_check.simulator_check(
            request, {"main": graph}, {"main": graph_contract(graph)}, {"main": None}, decoder
        )

    near_silent = load_code2wav_decoder(near_silent_checkpoint)
    passed = check(near_silent, "near_silent", 1e-4)
    assert passed["passed"] and passed["snr_db_vs_full_decode"] < 0 and passed["max_abs_diff"] < 1e-3
    assert "dBFS" in passed["verdict"] and "passed" in passed["verdict"]
    loud_noise = check(near_silent, "near_silent", 0.05)
    assert not loud_noise["passed"] and "MISSED" in loud_noise["verdict"]
    loud = check(small_decoder, "loud", 1e-2)
    assert not loud["passed"] and 10 < loud["snr_db_vs_full_decode"] < 25 and loud["max_abs_diff"] > 1e-2
