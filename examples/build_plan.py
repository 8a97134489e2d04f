"""Build, verify and validate the execution plan of one hardware class from a checkpoint.

    .venv/bin/python examples/build_plan.py --model CKPT --hardware cpu_x86_64 --out plans/cpu_x86_64

The library calls behind `python -m vllm_omni.edge build`: every artifact is exported, run in its
runtime against the full decode, and described in exec_plan.json; re-running keeps intact artifacts.
"""

import argparse
from pathlib import Path

from vllm_omni.edge.builders.registry import build
from vllm_omni.edge.builders.request import BuildRequest
from vllm_omni.edge.hardware import get_hardware_class
from vllm_omni.edge.plan.model import ExecPlan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument(
        "--hardware", default="cpu_x86_64", help="npu_phone, rockchip_npu, cpu_x86_64, cpu_arm64, browser"
    )
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    hardware_class = get_hardware_class(args.hardware)
    build(hardware_class, BuildRequest(model=args.model, out_dir=args.out, progress=print))
    plan = ExecPlan.load(args.out)  # schema, contracts, every file's size and sha256
    print(plan.summary())


if __name__ == "__main__":
    main()
