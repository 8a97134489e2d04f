"""rockchip_npu: compile step graphs with rknn-toolkit2 2.5.0 (converter venv) and check them in its simulator.

The checkpoint is a small-geometry ``moderate`` drive one (RANDOM WEIGHTS, :mod:`vllm_omni.testing.drive`):
its fp16 ceiling sits near 60 dB, so a 55 dB bar catches a graph that loses precision. The ``hot``
weights of ``make_checkpoint`` top out near 47 dB in any fp16 arithmetic (torch half precision too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[4]
CONVERTER = ("-m", "vllm_omni.edge", "rknn-convert")
CONVERTER_PYTHON = REPO_ROOT / ".venv-rknn" / "bin" / "python"
# The command Rockchip users know: a thin script over the same CLI (same flags, same exit codes).
CONVERTER_SCRIPT = (str(REPO_ROOT / "tools" / "rknn" / "prepare_qwen3_tts_rknn_vocoder.py"),)


def prepare(*args, python: Path | str = CONVERTER_PYTHON, env=None, entry=CONVERTER) -> subprocess.CompletedProcess:
    if python == CONVERTER_PYTHON and not CONVERTER_PYTHON.exists():
        pytest.fail("the converter venv is missing: run `make setup-rknn` (make test does)")
    return subprocess.run(
        [str(python), *entry, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=900,
    )


def edge_build(*args) -> subprocess.CompletedProcess:
    """`python -m vllm_omni.edge build` from the main venv: ONNX export here, compile in the converter venv."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_omni.edge", "build", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )


@pytest.fixture(scope="module")
def moderate_decoder(moderate_checkpoint):
    """The decoder of the session's ``moderate`` drive checkpoint (tests/edge/conftest.py)."""
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    return load_code2wav_decoder(moderate_checkpoint)


@pytest.fixture(scope="module")
def compiled(rockchip_plan, moderate_checkpoint, shared_plans) -> tuple[Path, subprocess.CompletedProcess]:
    """rockchip_npu: main step B=16 and first step B=4 for rk3588 in one .rknn (dynamic_input), checked in the
    simulator with one cache (built beside the earlier tests, tests/edge/conftest.py ``rockchip_plan``).

    Steps of 192 and 768 samples: a per-step SNR over fewer samples (B=2 is 96 here) scatters by about
    2 dB around the stream's even where the fp16 error is steady (docs/hardware/rockchip-npu.md).
    """
    out, result = rockchip_plan
    shared_plans.publish(moderate_checkpoint, "rockchip_npu", out)  # the serving tests serve it (tests/conftest.py)
    return out, result


def test_two_step_sizes_in_one_rknn_sharing_a_cache_pass_the_simulator_check(compiled):
    out, _ = compiled
    report = json.loads((out / "step_b4_b16.report.json").read_text())
    check = report["simulator_check"]
    assert report["toolkit_version"] == "2.5.0" and report["target"] == "rk3588"
    assert check["passed"] and check["steps"] == ([4, 16, 16, 16, 16] * 4)  # 20 steps, first/main mixed, one cache
    assert check["snr_db_vs_full_decode"] >= 55, check["verdict"]
    assert len(check["per_step_snr_db"]) == 20 and check["min_step_snr_db"] >= 50, check["per_step_snr_db"]
    # flat over the stream: no step more than 1 dB below the mean
    assert check["min_step_snr_db"] >= check["mean_step_snr_db"] - 1.0, check["per_step_snr_db"]
    assert check["onnxruntime_snr_db_vs_full_decode"] > 100  # the graph itself is exact; fp16 is the NPU's
    assert report["graph_layout"] == {"main": "time_on_height", "first": "time_on_height"}
    assert report["pass_frames"] == {"main": 16, "first": 4}  # rk3588: every step in one pass
    assert report["regtask_warnings"] == {"main": 0, "first": 0}  # every register field in range
    assert report["step_frames"] == {"main": 16, "first": 4}
    assert report["dynamic_input"] == {"step_b4_b16.rknn": [4, 16]}
    main, first = report["engines"]["main"], report["engines"]["first"]
    assert main == first and Path(main["path"]).name == "step_b4_b16.rknn"  # one compile, one file
    assert [shapes[0] for shapes in main["shape_sets"]] == [[1, 16, 4], [1, 16, 16]]
    assert Path(main["path"]).is_file() and main["size_bytes"] > 0
    assert main["regtask_warnings"] == 0 and Path(main["log_path"]).is_file()
    assert report["peak_rss_mb"]["main"] > 0
    assert sorted(path.name for path in out.glob("*.rknn")) == ["step_b4_b16.rknn"]
    assert sorted(path.name for path in out.glob("*.onnx")) == ["step_b4_b16.onnx"]
    assert not list(out.glob(".*partial*"))


def test_the_build_keeps_every_op_on_the_npu_but_the_allowed_ones_and_prints_no_lowering_line(compiled):
    """Issue 28: the toolkit's op placement in the report and the plan; librknnc's ``No lowering found`` lines
    (an Einsum on the CPU, from the V selection of the split K/V attention) gone from the terminal and the log."""
    from vllm_omni.edge.backends.rknn.convert import expected_cpu_ops
    from vllm_omni.edge.plan import ExecPlan

    out, result = compiled
    report = json.loads((out / "step_b4_b16.report.json").read_text())
    placement = report["placement"]["main"]
    assert placement == report["placement"]["first"] and placement["graphs"] == 2  # one table per shape set
    assert placement["no_lowering"] == [] and not report["cpu_ops_allowed"]
    assert set(placement["cpu_ops"]) <= set(expected_cpu_ops("rk3588")), placement["cpu_ops"]
    assert placement["cpu_ops"]["Gather"]["count"] == 16  # the int64 codebook lookups, one per codebook
    assert all(count > 300 for count in placement["npu_ops"])
    log = Path(report["engines"]["main"]["log_path"]).read_text(errors="replace")
    assert "Network Layer Information Table" in log and "No lowering found" not in log
    assert "No lowering found" not in result.stderr + result.stdout and "Einsum" not in log
    plan = ExecPlan.load(out)
    assert plan.build["placement"] == report["placement"] and plan.build["cpu_ops_allowed"] is False
    # the toolkit's check*.onnx stage dumps stay in its scratch directory, not in the caller's
    assert not list(REPO_ROOT.glob("check*.onnx")) and not list(out.glob("check*.onnx"))


def test_the_plan_summary_shows_the_op_placement_of_the_shared_rknn(compiled):
    """One ``placement`` line for the .rknn both steps share, its counts those of the plan's build.placement;
    `edge build` prints it."""
    from vllm_omni.edge.backends.rknn.convert import expected_cpu_ops
    from vllm_omni.edge.plan import ExecPlan

    out, result = compiled
    plan = ExecPlan.load(out)
    lines = [line for line in plan.summary().splitlines() if line.startswith("  placement ")]
    assert len(lines) == 1, lines  # main and first: one file, one compile
    npu, cpu, lowering = lines[0].removeprefix("  placement rk3588 step_b4_b16.rknn: ").split("; ")
    placement = plan.build["placement"]["main"]
    assert npu == f"2 graphs, {placement['npu_ops'][0]} + {placement['npu_ops'][1]} ops on the NPU"
    assert cpu.startswith("on the CPU (expected): ") and lowering == "without a lowering: none"
    kinds = dict(kind.split(" x") for kind in cpu.removeprefix("on the CPU (expected): ").split(", "))
    assert kinds == {op: str(entry["count"]) for op, entry in placement["cpu_ops"].items()}
    assert kinds["Gather"] == "16" and {"Sin", "Cos"} <= set(kinds) <= set(expected_cpu_ops("rk3588"))
    assert lines[0] in result.stdout.splitlines()


def test_the_exec_plan_names_both_artifacts_with_their_contracts_and_sources(compiled):
    from vllm_omni.edge.plan import ExecPlan

    out, result = compiled
    plan = ExecPlan.load(out)
    assert plan.speech_decoder == {
        "impl": "rknn",
        "artifacts": {"main": "/data/qwen3-tts/step_b4_b16.rknn", "first": "/data/qwen3-tts/step_b4_b16.rknn"},
    }
    assert (plan.hardware_class, plan.target, plan.codec.samples_per_frame, plan.dtype) == (
        "rockchip_npu",
        "rk3588",
        48,
        "fp16",
    )
    main, first = plan.artifacts["main"], plan.artifacts["first"]
    assert main.contract["step_frames"] == 16 and first.contract["step_frames"] == 4
    assert main.contract["max_step_frames"] == first.contract["max_step_frames"] == 16
    assert main.contract["cache_numel"] == first.contract["cache_numel"] == 7808
    assert main.contract["inputs"]["audio_codes"] == [1, 16, 16] and first.contract["inputs"]["freqs_in"] == [4, 16]
    assert (main.file, main.sha256, main.size_bytes) == (first.file, first.sha256, first.size_bytes)
    assert main.source == first.source and main.source["file"] == "step_b4_b16.onnx"
    assert main.verification["snr_db"] >= 55 and len(plan.model["checkpoint_sha256"]) == 64
    assert plan.build["regtask_warnings"] == {"main": 0, "first": 0} and not plan.build["register_overflow_allowed"]
    assert plan.build["graph_layout"] == {"main": "time_on_height", "first": "time_on_height"}
    assert plan.build["pass_frames"] == {"main": 16, "first": 4}
    assert plan.build["dynamic_input"] == {"step_b4_b16.rknn": [4, 16]}
    assert "--session-option 'qwen3_tts.exec_plan=" in result.stderr and "adb push" in result.stderr
    push = next(line for line in result.stderr.splitlines() if "adb push" in line)
    assert push.count("step_b4_b16.rknn") == 1  # the shared file goes to the board once
    assert "hardware class rockchip_npu (target rk3588)" in result.stdout


def test_a_recorded_stream_through_the_edge_client_in_the_simulator_matches_the_full_decode(
    compiled, moderate_decoder, tmp_path
):
    """The client with the plan's RKNN decoder, the rknn-toolkit2 simulator standing in for the board."""
    import wave

    import numpy as np
    import torch

    from vllm_omni.edge.audio import snr_db
    from vllm_omni.edge.plan import ExecPlan
    from vllm_omni.testing.streams import recording, segment_messages

    out, _ = compiled
    plan = ExecPlan.load(out)
    frames = np.random.default_rng(11).integers(0, 2048, size=(15, 16), dtype=np.int64)
    (tmp_path / "stream.qcs").write_bytes(recording(segment_messages(plan, [frames], per_message=5)))
    command = [str(CONVERTER_PYTHON), "-m", "vllm_omni.edge", "client", "--stream", str(tmp_path / "stream.qcs")]
    command += ["--plan", str(out), "--rknn-runtime", "simulator", "--out", str(tmp_path / "rk.wav")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with wave.open(str(tmp_path / "rk.wav")) as handle:
        audio = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2") / 32767.0
    with torch.inference_mode():
        reference = moderate_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    assert snr_db(reference, audio) >= 40  # PCM16 in the WAV
    assert "15 frames" in result.stderr and "first audio after" in result.stderr


def test_a_rebuild_keeps_the_compiled_steps(compiled, moderate_checkpoint):
    out, _ = compiled
    result = edge_build(
        "--hardware", "rockchip_npu", "--model", moderate_checkpoint, "--out", out,
        "--step-frames", 16, "--first-step-frames", 4, "--no-check",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kept the rk3588 .rknn steps" in result.stderr and "compiling" not in result.stderr


def test_an_existing_dynamic_graph_needs_the_first_step_size(compiled, tmp_path):
    """A dynamic graph compiles for a set of step sizes (the builder passes --first-codes-length, as here)."""
    out, _ = compiled
    graph = shutil.copy(out / "step_b4_b16.onnx", tmp_path / "given.onnx")
    result = prepare("--onnx", graph, "--output", tmp_path / "given.rknn")
    assert result.returncode == 2 and "give --first-codes-length" in result.stderr
    result = prepare("--onnx", graph, "--first-codes-length", 16, "--output", tmp_path / "given.rknn")
    assert result.returncode == 2 and "--first-codes-length must be 1..15" in result.stderr
    assert not (tmp_path / "given.rknn").exists() and "Traceback" not in result.stderr


def test_a_static_graph_per_step_size_compiles_alone_through_the_tools_script(moderate_checkpoint, tmp_path):
    """The two-file path (``--separate-step-graphs``): a static step graph, compiled on its own by
    ``tools/rknn/prepare_qwen3_tts_rknn_vocoder.py --onnx`` as the library command would."""
    result = prepare(
        "--model-dir", moderate_checkpoint, "--codes-length", 4, "--skip-rknn", "--output", tmp_path / "given.onnx"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    graph = tmp_path / "given.onnx"
    result = prepare("--onnx", graph, "--target", "rk3588", "--output", tmp_path / "given.rknn", entry=CONVERTER_SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    check = json.loads((tmp_path / "given.report.json").read_text())["simulator_check"]
    assert check["passed"] and check["snr_db_vs_onnxruntime"] >= 40 and "snr_db_vs_full_decode" not in check
    plan = json.loads((tmp_path / "exec_plan.json").read_text())
    assert plan["artifacts"]["main"]["contract"]["head_dim"] == 32 and plan["model"]["checkpoint_sha256"] is None
    assert "on the RKNN risk list" not in result.stderr  # the NPU graph holds no Shape, Pad, Neg, ...
    placement = json.loads((tmp_path / "given.report.json").read_text())["placement"]["main"]
    assert placement["graphs"] == 1 and placement["no_lowering"] == [] and "Einsum" not in placement["cpu_ops"]
    assert "No lowering found" not in result.stderr + result.stdout


def test_a_non_step_onnx_is_one_clear_line(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "not_a_step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "relu.onnx")
    result = prepare("--onnx", tmp_path / "relu.onnx", "--output", tmp_path / "relu.rknn")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1
    assert "is not a Qwen3-TTS stateful step graph" in errors[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "relu.rknn").exists()


def test_unknown_target_and_unwritable_output_fail_in_one_line(tmp_path):
    result = prepare("--onnx", tmp_path / "x.onnx", "--target", "rk9999", "--output", tmp_path / "x.rknn")
    assert result.returncode == 2 and "invalid choice: 'rk9999'" in result.stderr
    result = prepare(
        "--onnx", tmp_path / "x.onnx", "--target", "rk9999", "--output", tmp_path / "x.rknn", entry=CONVERTER_SCRIPT
    )  # fmt: skip
    assert result.returncode == 2 and "invalid choice: 'rk9999'" in result.stderr
    assert "usage: python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py" in result.stderr
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = prepare("--onnx", tmp_path / "x.onnx", "--output", blocker / "sub" / "x.rknn")
    assert result.returncode == 2 and "cannot create the output directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_the_converter_venv_the_full_path_says_how_to_make_it(small_checkpoint, tmp_path):
    env = {**os.environ, "QWEN3_TTS_MODEL": str(small_checkpoint)}
    result = prepare("--codes-length", 2, "--output", tmp_path / "step.rknn", python=sys.executable, env=env)
    assert result.returncode == 1 and "make setup-rknn" in result.stderr and ".venv-rknn/bin/python" in result.stderr
    assert not (tmp_path / "step.onnx").exists()  # refused before any export work
