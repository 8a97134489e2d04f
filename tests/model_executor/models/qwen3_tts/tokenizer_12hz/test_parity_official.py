"""Parity with the official qwen-tts 0.1.1 implementation (the oracle, run in .venv-oracle).

The oracle builds the official decoder, fills it with random non-trivial weights, writes a
checkpoint in the released layout and decodes; we load that directory with our loader and
decode the same codes. Bar: max abs difference <= 1e-4. Measured numbers are written to
``out/test-reports/parity-<geometry>.json``.

The small and odd geometries run the whole pattern of lengths (both sides of the attention window, past it,
``chunked_decode`` across its 300-frame chunks); the released geometry runs one stream across its 72-frame window,
and its whole sweep is ``make bench-parity`` (``benchmarks/bench_parity.py``, two to three minutes on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2DecoderConfig
from vllm_omni.testing.make_checkpoint import decoder_shapes

pytestmark = pytest.mark.oracle

REPO_ROOT = Path(__file__).resolve().parents[5]
ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"
ORACLE_SCRIPT = REPO_ROOT / "tools" / "oracle" / "qwen_tts_oracle.py"
REPORTS = REPO_ROOT / "out" / "test-reports"
TOLERANCE = 1e-4


def parity_snr_db(expected: torch.Tensor, ours: torch.Tensor) -> float:
    return snr_db(expected.detach().numpy(), ours.detach().numpy())


def run_oracle(workdir: Path, config: Qwen3TTSTokenizerV2DecoderConfig, frames: list[int], chunked: int):
    if not ORACLE_PYTHON.exists():
        pytest.fail(f"the oracle venv is missing ({ORACLE_PYTHON}); build it with `make setup-oracle`")
    geometry = workdir / "decoder_config.json"
    geometry.write_text(json.dumps(config.to_dict()))
    checkpoint, results = workdir / "checkpoint", workdir / "oracle.pt"
    command = [
        str(ORACLE_PYTHON),
        str(ORACLE_SCRIPT),
        "--decoder-config",
        str(geometry),
        "--checkpoint-dir",
        str(checkpoint),
        "--results",
        str(results),
        "--frames",
        *map(str, frames),
        "--chunked-frames",
        str(chunked),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return checkpoint, torch.load(results)


def compare(name: str, config, frames: list[int], chunked: int, tmp_path: Path) -> None:
    """Our decode of each forward length and (``chunked`` > 0) of ``chunked_decode`` against the oracle's."""
    checkpoint, oracle = run_oracle(tmp_path, config, frames, chunked)
    assert oracle["shapes"] == decoder_shapes(config), "checkpoint layout differs from the official module's"
    decoder = load_code2wav_decoder(checkpoint)
    report = {"geometry": name, "attn_implementation_official": oracle["attn_implementation"], "forward": {}}
    failures = []
    with torch.inference_mode():
        for count in frames:
            codes, expected = oracle[f"forward/{count}"]
            ours = decoder(codes)
            assert ours.shape == expected.shape
            difference = float((ours - expected).abs().max())
            report["forward"][count] = {"max_abs": difference, "snr_db": parity_snr_db(expected, ours)}
            if difference > TOLERANCE:
                failures.append(f"forward T={count}: max abs {difference:.3g}")
        if chunked:
            codes, expected = oracle["chunked"]
            ours = decoder.chunked_decode(codes)
            assert ours.shape == expected.shape
            difference = float((ours - expected).abs().max())
            snr = parity_snr_db(expected, ours)
            report["chunked_decode"] = {"frames": chunked, "max_abs": difference, "snr_db": snr}
            if difference > TOLERANCE:
                failures.append(f"chunked_decode T={chunked}: max abs {difference:.3g}")
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"parity-{name}.json").write_text(json.dumps(report, indent=2))
    assert not failures, f"over {TOLERANCE}: {failures}; report: {report}"


def test_small_geometry_matches_official(tmp_path):
    compare("small", Qwen3TTSTokenizerV2DecoderConfig.small(), [1, 7, 8, 9, 40, 150], 400, tmp_path)


def test_odd_geometry_matches_official(tmp_path, odd_geometry):
    compare("odd", odd_geometry, [1, 5, 6, 33], 400, tmp_path)


def test_released_geometry_matches_official_across_the_attention_window(tmp_path):
    # 73 frames: the first 72 see every frame before them, the last the 72-frame window without frame 0 (the
    # decoder is causal, so these are the outputs of T=71 and 72 too). The lengths past the window and the
    # chunked decode run at the small and odd geometries here, and at this one in `make bench-parity`.
    compare("released", Qwen3TTSTokenizerV2DecoderConfig.released(), [1, 73], 0, tmp_path)
