"""``python -m vllm_omni.edge hardware list|detect``: the hardware classes, and a guess for this machine."""

from __future__ import annotations

import argparse

from ..hardware import detect, hardware_classes
from .types import CLISubcommand


class HardwareSubcommand(CLISubcommand):
    name = "hardware"
    help = "the hardware classes"

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        hardware, hardware_commands = self.add_parser(subparsers, commands="hardware_command")
        hardware_commands.add_parser("list", help="every known class")
        hardware_commands.add_parser(
            "detect", help="suggest a class for this machine ($VLLM_OMNI_EDGE_HARDWARE overrides)"
        )
        return hardware

    def cmd(self, args: argparse.Namespace) -> int:
        if args.hardware_command == "list":
            for record in hardware_classes().values():
                kind = f"{record.name:<14} {record.graph_kind:<9} {record.backend:<12} {record.dtype}"
                print(f"{kind}  {record.description}")
                if record.targets:
                    print(f"{'':<14} targets: {', '.join(record.targets)}")
                for graph_kind in record.graph_kinds if len(record.graph_kinds) > 1 else ():
                    default = " (default)" if graph_kind == record.graph_kind else f" (--graph {graph_kind})"
                    note = record.graph_notes.get(graph_kind, "")
                    print(f"{'':<14} {graph_kind}{default}: {note}")
                if record.build_note:
                    print(f"{'':<14} build: {record.build_note}")
                if record.variants:
                    variants = ", ".join(f"{name} ({needs})" for name, needs in record.variants.items())
                    print(f"{'':<14} partitioners: {variants}")
            return 0
        found = detect()
        print(f"{found.hardware_class}" + (f" (target {found.target})" if found.target else "") + f": {found.reason}")
        return 0
