"""`python -m vllm_omni.edge.cli.rknn_convert`, ONNX half (the main venv)."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CONVERTER = ("-m", "vllm_omni.edge.cli.rknn_convert")


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
