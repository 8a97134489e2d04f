"""Released-geometry RKNN compile and simulator check, one process per step size.

    .venv-rknn/bin/python benchmarks/bench_rknn.py --out out/bench [--steps 16 64] [--geometry released]

RANDOM WEIGHTS (a released-layout checkpoint written by make_checkpoint, reused across runs).
Per step size B, ``python -m vllm_omni.edge.cli.rknn_convert`` exports the ONNX step graph
(self-checked in onnxruntime), compiles it for rk3588 in fp16 and runs the simulator check (3
steps from a zero cache against the full decode). Reports wall seconds of the whole run, compile
seconds, ``.rknn`` size, the toolkit's ``REGTASK ... exceeds the limit`` warning count, and
simulator SNR (overall and per step). Writes ``rknn.json`` and prints a table. A build of the
released graph takes about 5 GB of RAM; run one at a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--geometry", choices=("released", "small"), default="released")
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--target", default="rk3588")
    args = parser.parse_args(argv)

    from vllm_omni.edge.testing.make_checkpoint import ensure_checkpoint

    model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry)
    rows = []
    for size in args.steps:
        out_dir = args.out / f"rknn-{args.geometry}-b{size}"
        output = out_dir / f"step_b{size}.rknn"
        command = [sys.executable, "-m", "vllm_omni.edge.cli.rknn_convert"]
        command += ["--model-dir", str(model), "--codes-length", str(size), "--target", args.target]
        command += ["--output", str(output)]
        print(f"[bench] B={size}: {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        (out_dir / "prepare.log").write_text(completed.stdout + completed.stderr)
        report_path = output.with_name(output.stem + ".report.json")
        if not report_path.exists():
            raise SystemExit(f"B={size} failed (exit {completed.returncode}); see {out_dir / 'prepare.log'}")
        report = json.loads(report_path.read_text())
        engine, check = report["engines"]["main"], report["simulator_check"]
        rows.append(
            {
                "step_frames": size,
                "exit_code": completed.returncode,
                "wall_seconds": round(seconds, 1),
                "compile_seconds": engine["build_seconds"],
                "rknn_mb": engine["size_bytes"] / 1e6,
                "regtask_warnings": engine["regtask_warnings"],
                "simulator_snr_db_vs_full": check.get("snr_db_vs_full_decode"),
                "per_step_snr_db": check["per_step_snr_db"],
                "onnxruntime_snr_db_vs_full": check.get("onnxruntime_snr_db_vs_full_decode"),
                "simulator_seconds": check["simulator_seconds"],
                "toolkit_version": report["toolkit_version"],
            }
        )
        print(f"[bench]   {json.dumps(rows[-1])}", flush=True)
    result = {"benchmark": "rknn fp16 compile + simulator", "weights": "random", "geometry": args.geometry,
              "target": args.target, "rows": rows}  # fmt: skip
    (args.out / "rknn.json").write_text(json.dumps(result, indent=2))
    print(f"\n{args.geometry} geometry, RANDOM WEIGHTS, {args.target}, fp16, simulator")
    print("B | compile s | .rknn MB | REGTASK warnings | sim SNR dB vs full | per step | ORT SNR dB | wall s")
    for row in rows:
        print(
            f"{row['step_frames']} | {row['compile_seconds']:.0f} | {row['rknn_mb']:.0f} | {row['regtask_warnings']} | "
            f"{row['simulator_snr_db_vs_full']:.1f} | {row['per_step_snr_db']} | "
            f"{row['onnxruntime_snr_db_vs_full']:.1f} | {row['wall_seconds']:.0f}"
        )
    print(f"-> {args.out / 'rknn.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
