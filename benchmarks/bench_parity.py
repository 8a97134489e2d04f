"""Parity with the official qwen-tts decoder over every length, at the released geometry (the suite's long sweep).

    python -m benchmarks.bench_parity --out out/bench [--geometry released] [--frames 1 7 71 72 73 150]
        [--chunked-frames 400]

The suite checks the same property cheaply
(``tests/model_executor/models/qwen3_tts/tokenizer_12hz/test_parity_official.py``): this pattern of lengths
(both sides of the attention window, past it, the official ``chunked_decode`` across its 300-frame chunks) at the
small and the odd geometry, and one stream across the 72-frame window at the released one. Here the released
geometry runs the whole sweep, two to three minutes on 2 cores.

The oracle (``tools/oracle/qwen_tts_oracle.py`` in ``.venv-oracle``, ``make setup-oracle``) builds the official
decoder with RANDOM WEIGHTS, writes a checkpoint in the released layout and decodes seeded codes; we load that
directory and decode the same codes. Bar: max abs difference <= 1e-4 per length. Writes ``parity_<geometry>.json``
and ``parity_<geometry>.md`` (frames, max abs, SNR dB, our decode seconds) and exits 1 when a length is over the bar.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import REPO_ROOT, BenchmarkError, run_cli, table, write_json
from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2DecoderConfig
from vllm_omni.testing.make_checkpoint import decoder_shapes

ORACLE_PYTHON = REPO_ROOT / ".venv-oracle" / "bin" / "python"
ORACLE_SCRIPT = REPO_ROOT / "tools" / "oracle" / "qwen_tts_oracle.py"
TOLERANCE = 1e-4
GEOMETRIES = {"released": Qwen3TTSTokenizerV2DecoderConfig.released, "small": Qwen3TTSTokenizerV2DecoderConfig.small}


def official_decodes(work: Path, geometry: str, frames: list[int], chunked: int) -> tuple[Path, dict, float]:
    """Run the oracle: its checkpoint directory, its results (codes and audio per length) and its seconds."""
    if not ORACLE_PYTHON.exists():
        raise BenchmarkError(f"the oracle venv is missing ({ORACLE_PYTHON}); build it with `make setup-oracle`")
    (work / "decoder_config.json").write_text(json.dumps(GEOMETRIES[geometry]().to_dict()))
    checkpoint, results = work / "checkpoint", work / "oracle.pt"
    command = [str(ORACLE_PYTHON), str(ORACLE_SCRIPT), "--decoder-config", str(work / "decoder_config.json")]
    command += ["--checkpoint-dir", str(checkpoint), "--results", str(results), "--frames", *map(str, frames)]
    command += ["--chunked-frames", str(chunked)]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if completed.returncode != 0:
        raise BenchmarkError(f"the oracle failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    return checkpoint, torch.load(results), time.perf_counter() - started


def row_of(label: str, frames: int, expected: torch.Tensor, ours: torch.Tensor, seconds: float) -> dict:
    if ours.shape != expected.shape:
        return {"decode": label, "frames": frames, "shape": list(ours.shape), "official_shape": list(expected.shape)}
    max_abs = float((ours - expected).abs().max())
    return {
        "decode": label,
        "frames": frames,
        "max_abs": max_abs,
        "snr_db": snr_db(expected.numpy(), ours.numpy()),
        "ours_seconds": round(seconds, 3),
        "within": max_abs <= TOLERANCE,
    }


def compare(checkpoint: Path, oracle: dict, frames: list[int], chunked: int) -> list[dict]:
    decoder = load_code2wav_decoder(checkpoint)
    if oracle["shapes"] != decoder_shapes(decoder.config):
        raise BenchmarkError("the oracle's checkpoint layout differs from the official module's")
    cases = [("forward", count, *oracle[f"forward/{count}"], decoder) for count in frames]
    if chunked:
        cases.append(("chunked_decode", chunked, *oracle["chunked"], decoder.chunked_decode))
    rows = []
    with torch.inference_mode():
        for label, count, codes, expected, decode in cases:
            started = time.perf_counter()
            ours = decode(codes)
            rows.append(row_of(label, count, expected, ours, time.perf_counter() - started))
            print(f"[bench] {label} T={count}: {rows[-1].get('max_abs', 'shape differs')}", flush=True)
    return rows


def report_table(report: dict) -> str:
    rows = []
    for row in report["rows"]:
        if "max_abs" not in row:
            shape = f"shape {row['shape']} vs {row['official_shape']}"
            rows.append((row["decode"], row["frames"], shape, "", "", "no"))
            continue
        snr = "inf" if math.isinf(row["snr_db"]) else f"{row['snr_db']:.1f}"
        within = "yes" if row["within"] else "NO"
        rows.append((row["decode"], row["frames"], f"{row['max_abs']:.2e}", snr, f"{row['ours_seconds']:.2f}", within))
    lines = [
        f"# Parity with the official decoder, {report['geometry']} geometry (RANDOM WEIGHTS)",
        "",
        f"Bar: max abs difference <= {report['tolerance']:g}; official attention: {report['attn_official']}; "
        f"the oracle ran {report['oracle_seconds']:.0f} s; torch {report['torch']}.",
        "",
        table(("decode", "frames", "max abs", "SNR dB", "ours s", "within"), rows, align="lrrrrl"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="released")
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 7, 71, 72, 73, 150])
    parser.add_argument("--chunked-frames", type=int, default=400, help="0: no chunked_decode")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="bench-parity-") as scratch:
        checkpoint, oracle, oracle_seconds = official_decodes(Path(scratch), args.geometry, args.frames,
                                                              args.chunked_frames)  # fmt: skip
        rows = compare(checkpoint, oracle, args.frames, args.chunked_frames)
    report = {
        "benchmark": "parity with the official qwen-tts decoder (tools/oracle/qwen_tts_oracle.py)",
        "weights": "random",
        "geometry": args.geometry,
        "tolerance": TOLERANCE,
        "attn_official": oracle["attn_implementation"],
        "oracle_seconds": round(oracle_seconds, 1),
        "torch": torch.__version__,
        "rows": rows,
    }
    stem = args.out / f"parity_{args.geometry}"
    write_json(stem.with_suffix(".json"), report)
    stem.with_suffix(".md").write_text(report_table(report))
    print(report_table(report), end="")
    print(f"-> {stem.with_suffix('.json')}, {stem.with_suffix('.md')}")
    over = [f"{row['decode']} T={row['frames']}" for row in rows if not row.get("within")]
    if over:
        print(f"over the bar {TOLERANCE:g} or a different shape: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
