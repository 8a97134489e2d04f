"""``vllm-omni-edge rknn-convert`` (converter venv): compile step graphs to ``.rknn``, check, plan.

``python tools/rknn/prepare_qwen3_tts_rknn_vocoder.py`` is the same command under the name Rockchip
users know (a thin script that calls :func:`main`). The library is
:mod:`vllm_omni.edge.builders.rknn.convert`. Exit codes: 0 done, 1 a failed stage, 2 bad arguments,
4 the simulator check missed the bar, 5 REGTASK register-overflow warnings (without
``--allow-register-overflow``), 6 ops off the NPU that the allow-list does not name or that have no
lowering (without ``--allow-cpu-ops``). ``--outcome-json FILE`` also writes the outcome as JSON
(``status``: ``ok``, ``usage``, ``failed``, ``below_bar``, ``register_overflow``, ``cpu_ops``;
``error``; ``plan``, ``report``): what the ``rknn`` builder (``rockchip_npu``) reads instead of the exit code.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ..backends.rknn.convert import TARGETS
from ..builders.rknn.errors import EXIT_CODES
from ..errors import EdgeError
from ..graphs.layouts import GRAPH_LAYOUTS, NPU_LAYOUT, layouts_for
from ..plan.model import DEFAULT_DEVICE_DIR, session_option
from .types import add_checkpoint_argument

PROG = "vllm-omni-edge rknn-convert"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Prepare the Qwen3-TTS vocoder (Code2Wav) stateful step graph for a Rockchip NPU.",
    )
    add_checkpoint_argument(parser, "--model-dir", "checkpoint dir or hub id")
    parser.add_argument("--onnx", type=Path, help="compile this existing step graph (B, N, head_dim read from it)")
    parser.add_argument("--first-onnx", type=Path, help="with --onnx: an existing small first-step graph")
    parser.add_argument("--codes-length", type=int, default=16, help="frames per step (B)")
    parser.add_argument("--first-codes-length", type=int, help="also make a small first-step graph of B1 frames")
    parser.add_argument(
        "--dynamic-input",
        action="store_true",
        help="with --first-codes-length: one graph and one .rknn (rknn-toolkit2 dynamic_input) for both step sizes",
    )
    parser.add_argument("--target", choices=TARGETS, default="rk3588")
    parser.add_argument("--opt-level", type=int, choices=(0, 1, 2, 3), default=3, help="rknn optimization_level")
    parser.add_argument("--output", type=Path, required=True, help=".rknn (the ONNX goes beside it) or .onnx")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--skip-rknn", action="store_true", help="stop after the ONNX step graph")
    parser.add_argument("--check-only", action="store_true", help="only run the self-check of an existing graph")
    parser.add_argument("--device-dir", default=DEFAULT_DEVICE_DIR, help="where the artifacts go on the board")
    parser.add_argument(
        "--check-steps", type=int, default=20, help="steps in the simulator check (>= 3; first/main mixed)"
    )
    parser.add_argument(
        "--graph-layout",
        choices=layouts_for("onnx", "npu"),
        default=NPU_LAYOUT,
        help="formulation of graphs exported here: "
        + "; ".join(f"{name}: {GRAPH_LAYOUTS[name].summary}" for name in layouts_for("onnx", "npu")),
    )
    parser.add_argument(
        "--pass-frames",
        type=int,
        help="decode each step of graphs exported here in equal passes of at most this many frames (rk3576: 16)",
    )
    parser.add_argument(
        "--allow-register-overflow",
        action="store_true",
        help="keep a build whose toolkit log has REGTASK bit-width warnings (simulator only; a board may differ)",
    )
    parser.add_argument(
        "--allow-cpu-ops",
        action="store_true",
        help="keep a build with ops on the CPU beyond the allow-list or without a lowering (a board may abort)",
    )
    parser.add_argument("--outcome-json", type=Path, help="also write the outcome here as JSON")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the converter; ``prog`` is the name usage lines show (the module or the ``tools/rknn`` script)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    from ..builders.rknn.convert import ConvertRequest, run
    from ..builders.rknn.errors import ConvertUsageError, CpuOpsError, RegisterOverflowError, SimulatorCheckError

    options = {key: value for key, value in vars(args).items() if key != "outcome_json"}
    outcome: dict[str, Any] = {"status": "ok", "error": None, "plan": None, "report": None}
    try:
        result = run(ConvertRequest(**options), report=print)
    except ConvertUsageError as exc:
        outcome |= {"status": "usage", "error": str(exc)}
    except RegisterOverflowError as exc:
        outcome |= {"status": "register_overflow", "error": str(exc), "report": str(exc.report_path)}
    except CpuOpsError as exc:
        outcome |= {"status": "cpu_ops", "error": str(exc), "report": str(exc.report_path)}
    except SimulatorCheckError as exc:
        outcome |= {"status": "below_bar", "error": str(exc), "report": str(exc.report_path)}
    except EdgeError as exc:
        outcome |= {"status": "failed", "error": str(exc)}
    else:
        if result is not None:
            outcome |= {"plan": str(result.plan_path), "report": str(result.report_path)}
            print(f"simulator check: {result.check['verdict']}")
            print(f"report: {result.report_path}\nexec plan: {result.plan_path}")
            files = " ".join(dict.fromkeys(str(result.plan.path(role)) for role in result.plan.artifacts))
            print("deploy (adb; or scp to the board):")
            print(f"  adb shell mkdir -p {args.device_dir} && adb push {files} {result.plan_path} {args.device_dir}/")
            print(f"  --session-option '{session_option(result.plan)}'")
    if outcome["error"]:
        print(f"error: {outcome['error']}", file=sys.stderr)
    if args.outcome_json is not None:
        args.outcome_json.write_text(json.dumps(outcome, indent=2))
    return EXIT_CODES[outcome["status"]]
