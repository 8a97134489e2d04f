"""``python -m vllm_omni.edge build``: build, verify and describe every artifact of a hardware class."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..plan.model import DEFAULT_DEVICE_DIR
from ..progress import progress_printer
from .types import CLISubcommand

say = progress_printer("build")


class BuildSubcommand(CLISubcommand):
    name = "build"
    help = "build, verify and describe every artifact of a hardware class"

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        build, _ = self.add_parser(subparsers)
        build.add_argument("--hardware", required=True, help="hardware class (`hardware list` shows them)")
        build.add_argument("--model", required=True, help="checkpoint dir or hub id")
        build.add_argument("--out", required=True, type=Path, help="plan directory (artifacts + exec_plan.json)")
        build.add_argument("--target", help="SoC, for classes that compile per SoC (rockchip_npu: rk3588, ...)")
        build.add_argument(
            "--graph",
            choices=("windowed", "stateful"),
            help="graph kind, for classes that build both (npu_phone: windowed by default, or the exact stateful step)",
        )
        build.add_argument("--ramp", type=int, nargs="+", help="windowed classes: chunk sizes in frames")
        build.add_argument("--context", type=int, help="windowed classes: frames of history before each chunk")
        build.add_argument("--partitioner", help="ExecuTorch classes: delegate partitioner (xnnpack, coreml, none)")
        build.add_argument("--step-frames", type=int, help="stateful classes: frames per main step (B)")
        build.add_argument("--first-step-frames", type=int, help="stateful classes: frames of the first step (0: none)")
        build.add_argument(
            "--separate-step-graphs",
            action="store_true",
            help="NPU stateful classes: a graph (and a compiled file) per step size instead of one for both",
        )
        build.add_argument(
            "--device-dir", default=DEFAULT_DEVICE_DIR, help="where the plan directory sits on the device"
        )
        build.add_argument("--no-check", action="store_true", help="skip running each artifact against the reference")
        build.add_argument(
            "--force", action="store_true", help="replace an exec_plan.json / manifest.json in --out not written here"
        )
        return build

    def cmd(self, args: argparse.Namespace) -> int:
        from ..builders.registry import build
        from ..builders.request import BuildArgumentError, BuildRequest
        from ..graphs.window_contract import WindowConfigError
        from ..hardware import get_hardware_class

        hardware_class = get_hardware_class(args.hardware)
        if args.target and not hardware_class.targets:
            print(f"error: --target: {hardware_class.name} is not compiled per SoC (no targets)", file=sys.stderr)
            return 2
        request = BuildRequest(
            model=args.model,
            out_dir=args.out,
            target=args.target,
            graph=args.graph,
            ramp=tuple(args.ramp) if args.ramp else None,
            context_frames=args.context,
            partitioner=args.partitioner,
            step_frames=args.step_frames,
            first_step_frames=args.first_step_frames,
            one_step_graph=False if args.separate_step_graphs else None,
            device_dir=args.device_dir,
            check=not args.no_check,
            force=args.force,
            progress=say,
        )
        say(f"{hardware_class.name}: {hardware_class.description}")
        try:
            plan = build(hardware_class, request)  # checks the request before any work
        except (BuildArgumentError, WindowConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(plan.summary())
        return 0
