"""``python -m vllm_omni.edge plan validate|show DIR``: check or summarise an execution plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..plan.model import ExecPlan
from .types import CLISubcommand


class PlanSubcommand(CLISubcommand):
    name = "plan"
    help = "check or summarise an execution plan"

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        plan, plan_commands = self.add_parser(subparsers, commands="plan_command")
        validate = plan_commands.add_parser("validate", help="schema, contracts and every artifact's size and sha256")
        validate.add_argument("path", type=Path, help="plan directory or exec_plan.json")
        show = plan_commands.add_parser("show", help="a human-readable summary (validated first)")
        show.add_argument("path", type=Path)
        show.add_argument("--json", action="store_true", help="print the plan itself")
        return plan

    def cmd(self, args: argparse.Namespace) -> int:
        plan = ExecPlan.load(args.path)
        if args.plan_command == "validate":
            count = len(plan.artifacts)
            print(f"valid: plan {plan.plan_id[:12]} ({plan.hardware_class}, {count} artifacts, sha256 checked)")
        elif args.json:
            print(json.dumps(plan.to_json(), indent=2))
        else:
            print(plan.summary())
        return 0
