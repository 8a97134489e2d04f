"""``tools/gpu_check.py`` on the CPU: every check it runs on a GPU but the capture, at the small sizes.

The bucketed code predictor (what the GPU check captures in CUDA graphs) runs here at its static
shapes, so its padding and bucket choice are checked where no GPU is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vllm_omni.model_executor.models.qwen3_tts.code_predictor_graphs import BucketedCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.fused_code_predictor import FusedCodePredictor


def test_every_check_but_the_capture_passes_on_the_cpu(gpu_check, tmp_path: Path, capsys):
    args = ["--device", "cpu", "--geometry", "small", "--frames", "24", "--repeats", "1", "--batches", "1", "5"]
    args += ["--speed-batches", "1", "8", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    predictor = [row for row in report["rows"] if row["check"] == "code_predictor"]
    assert {(row["dtype"], row["batch"], row["bucket"]) for row in predictor} == {
        (dtype, batch, bucket) for dtype in ("float32", "bfloat16") for batch, bucket in ((1, 1), (5, 8))
    }
    for row in predictor:
        assert row["graph_equal"] and row["global_rng_untouched"] and not row["captured"]
        if row["dtype"] == "float32":
            assert row["greedy_equal_share"] == 1.0 and row["sampled_equal_share"] in (None, 1.0)
    speed = {row["batch"]: row for row in report["rows"] if row["check"] == "code_predictor_speed"}
    assert set(speed) == {1, 8}
    kernels = speed[8]["kernels"]  # ATen ops on a CPU
    assert kernels["reference"] >= 4 * kernels["fused"], kernels
    decoder = {row["check"]: row for row in report["rows"] if row["check"].startswith("decoder")}
    assert decoder["decoder_full"]["snr_db"] > 100 and decoder["decoder_stateful"]["snr_db"] > 90
    out = capsys.readouterr().out
    assert "| code_predictor | small | bfloat16 | 5 (8) |" in out and "| small | float32 | 8 |" in out


def test_a_failed_check_is_named_and_the_exit_code_says_so(gpu_check):
    rows = [
        {"check": "code_predictor", "dtype": "float32", "batch": 4, "greedy_equal_share": 0.5,
         "graph_equal": False, "global_rng_untouched": True},
        {"check": "decoder_full", "dtype": "float32", "batch": 24, "snr_db": 12.0, "samples_equal_length": True},
    ]  # fmt: skip
    bf16 = {"check": "code_predictor", "geometry": "0.6b", "dtype": "bfloat16", "graph_equal": True,
            "global_rng_untouched": False}  # fmt: skip
    rows += [{**bf16, "batch": 1, "greedy_equal_share": 0.4, "greedy_codes": 15},  # one frame: pooled with the rest
             {**bf16, "batch": 4, "greedy_equal_share": 0.6, "greedy_codes": 30}]  # fmt: skip
    lines = gpu_check.failures(rows)
    assert len(lines) == 6 and "greedy rows differ" in lines[0] and "replayed" in lines[1] and "12.0 dB" in lines[2]
    assert "RNG" in lines[3] and "RNG" in lines[4]
    assert "0.6b bfloat16: greedy codes agree with fp32's in 0.533 over all batches" in lines[5]


def test_without_cuda_it_says_what_to_pass(gpu_check, capsys):
    if torch.cuda.is_available():
        pytest.skip("needs a CUDA device absent: this machine has one")
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "pass --device cpu" in capsys.readouterr().err


def test_buckets_pad_a_step_to_a_static_size_without_changing_its_rows(gpu_check):
    predictor, talker_hidden = gpu_check.code_predictor("small")
    bucketed = BucketedCodePredictor(FusedCodePredictor(predictor), buckets=(2, 8))
    assert [bucketed.bucket_size(n) for n in (1, 2, 3, 8, 9)] == [2, 2, 8, 8, None]
    generator = torch.Generator().manual_seed(3)
    for rows in (1, 3, 8, 11):  # 11: beyond the largest bucket, eager at its own size
        hidden, code0 = (torch.randn(rows, talker_hidden, generator=generator) for _ in range(2))
        sampling = gpu_check.sampling(rows, "cpu")
        assert torch.equal(bucketed.predict(hidden, code0, sampling), predictor.predict(hidden, code0, sampling))
    with pytest.raises(ValueError, match="increasing sizes"):
        BucketedCodePredictor(FusedCodePredictor(predictor), buckets=(4, 2))
