"""``python -m vllm_omni.edge``: one command per job.

    python -m vllm_omni.edge build --hardware CLASS --model DIR_OR_ID --out DIR [--target rk3588]
    python -m vllm_omni.edge plan validate DIR
    python -m vllm_omni.edge plan show DIR
    python -m vllm_omni.edge hardware list
    python -m vllm_omni.edge hardware detect

``build`` makes every artifact of the class, verifies each in its runtime, and writes
``DIR/exec_plan.json``; a re-run keeps artifacts that are already built and intact. Exit codes:
0 success, 1 a failed build or an invalid plan (one ``error:`` line says which artifact and
field), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .errors import EdgeError
from .plan import DEFAULT_DEVICE_DIR


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni.edge", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build, verify and describe every artifact of a hardware class")
    build.add_argument("--hardware", required=True, help="hardware class (`hardware list` shows them)")
    build.add_argument("--model", required=True, help="checkpoint dir or hub id")
    build.add_argument("--out", required=True, type=Path, help="plan directory (artifacts + exec_plan.json)")
    build.add_argument("--target", help="SoC, for classes that compile per SoC (rockchip_npu: rk3588, ...)")
    build.add_argument("--ramp", type=int, nargs="+", help="windowed classes: chunk sizes in frames")
    build.add_argument("--context", type=int, help="windowed classes: frames of history before each chunk")
    build.add_argument("--partitioner", help="windowed classes: ExecuTorch partitioner (xnnpack, qnn, coreml, none)")
    build.add_argument("--step-frames", type=int, help="stateful classes: frames per main step (B)")
    build.add_argument("--first-step-frames", type=int, help="stateful classes: frames of the first step (0: none)")
    build.add_argument("--device-dir", default=DEFAULT_DEVICE_DIR, help="where the plan directory sits on the device")
    build.add_argument("--no-check", action="store_true", help="skip running each artifact against the reference")

    plan = commands.add_parser("plan", help="check or summarise an execution plan")
    plan_commands = plan.add_subparsers(dest="plan_command", required=True)
    validate = plan_commands.add_parser("validate", help="schema, contracts and every artifact's size and sha256")
    validate.add_argument("path", type=Path, help="plan directory or exec_plan.json")
    show = plan_commands.add_parser("show", help="a human-readable summary (validated first)")
    show.add_argument("path", type=Path)
    show.add_argument("--json", action="store_true", help="print the plan itself")

    hardware = commands.add_parser("hardware", help="the hardware classes")
    hardware_commands = hardware.add_subparsers(dest="hardware_command", required=True)
    hardware_commands.add_parser("list", help="every known class")
    hardware_commands.add_parser("detect", help="suggest a class for this machine ($VLLM_OMNI_EDGE_HARDWARE overrides)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    try:
        if args.command == "build":
            return _build(args)
        if args.command == "plan":
            return _plan(args)
        return _hardware(args)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _say(message: str) -> None:
    print(f"[build] {message}", file=sys.stderr, flush=True)


def _build(args: argparse.Namespace) -> int:
    from .hardware import get_hardware_class
    from .hardware.builders import BuildRequest, build

    hardware_class = get_hardware_class(args.hardware)
    if args.target and not hardware_class.targets:
        print(f"error: --target: {hardware_class.name} is not compiled per SoC (no targets)", file=sys.stderr)
        return 2
    request = BuildRequest(
        model=args.model,
        out_dir=args.out,
        target=args.target,
        ramp=tuple(args.ramp) if args.ramp else None,
        context_frames=args.context,
        partitioner=args.partitioner,
        step_frames=args.step_frames,
        first_step_frames=args.first_step_frames,
        device_dir=args.device_dir,
        check=not args.no_check,
        progress=_say,
    )
    _say(f"{hardware_class.name}: {hardware_class.description}")
    plan = build(hardware_class, request)
    print(plan.summary())
    return 0


def _plan(args: argparse.Namespace) -> int:
    from .plan import ExecPlan

    plan = ExecPlan.load(args.path)
    if args.plan_command == "validate":
        count = len(plan.artifacts)
        print(f"valid: plan {plan.plan_id[:12]} ({plan.hardware_class}, {count} artifacts, sha256 checked)")
    elif args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(plan.summary())
    return 0


def _hardware(args: argparse.Namespace) -> int:
    from .hardware import detect, hardware_classes

    if args.hardware_command == "list":
        for record in hardware_classes().values():
            print(f"{record.name:<14} {record.graph_kind:<9} {record.backend:<12} {record.dtype}  {record.description}")
            if record.targets:
                print(f"{'':<14} targets: {', '.join(record.targets)}")
            if record.variants:
                variants = ", ".join(f"{name} ({needs})" for name, needs in record.variants.items())
                print(f"{'':<14} partitioners: {variants}")
        return 0
    found = detect()
    print(f"{found.hardware_class}" + (f" (target {found.target})" if found.target else "") + f": {found.reason}")
    return 0
