"""Execution plans: the JSON a device runtime reads to know which artifacts decode a stream and how.

The Rockchip runtime takes the plan as a string through its session option
``qwen3_tts.exec_plan``; what it needs is the ``speech_decoder`` block::

    {"speech_decoder": {"impl": "rknn", "artifacts": {"main": PATH, "first": PATH}}}

The project's plan carries more beside that block (DESIGN §5): schema and version, hardware
class, model id, target SoC, sample rate, hop, codebooks, and per artifact its file (relative to
the plan), sha256, size and step contract (B, N, head_dim, kv slots, input names and shapes).
No torch: a board-side tool can read and check it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import EdgeError
from .files import write_json_atomically
from .step_contract import StepContract

EXEC_PLAN_SCHEMA = "vllm-omni-edge/exec-plan"
EXEC_PLAN_SCHEMA_VERSION = 1
EXEC_PLAN_NAME = "exec_plan.json"


class ExecPlanError(EdgeError):
    """A plan is malformed or does not match the artifacts it names."""


def step_contract_summary(contract: StepContract) -> dict[str, Any]:
    """What a runtime needs to feed one stateful step artifact."""
    return {
        "step_frames": contract.step_frames,
        "cache_numel": contract.cache_numel,
        "head_dim": contract.head_dim,
        "kv_slots": contract.kv_slots,
        "inputs": contract.input_shapes(),
        "outputs": contract.output_shapes(),
    }


def stateful_exec_plan(
    *,
    impl: str,
    hardware_class: str,
    model_id: str,
    artifacts: dict[str, dict[str, Any]],
    contracts: dict[str, StepContract],
    device_dir: str,
    target: str | None = None,
) -> dict[str, Any]:
    """A plan for stateful step artifacts (``main`` and optionally ``first``) that share one cache.

    ``artifacts[role]`` holds ``file`` (relative to the plan), ``sha256`` and ``size_bytes``;
    ``device_dir`` is where the plan's directory will sit on the device, which is where the
    ``speech_decoder`` block points (the runtime there opens those paths as they are).
    """
    if "main" not in artifacts:
        raise ExecPlanError(f"a stateful plan needs a 'main' artifact, found roles {sorted(artifacts)}")
    main = contracts["main"]
    for role, contract in contracts.items():
        if not contract.shares_cache_with(main):
            raise ExecPlanError(f"artifact {role!r} does not share the main artifact's cache layout; re-export both")
    device_paths = {role: f"{device_dir.rstrip('/')}/{entry['file']}" for role, entry in artifacts.items()}
    return {
        "speech_decoder": {"impl": impl, "artifacts": device_paths},
        "schema": EXEC_PLAN_SCHEMA,
        "schema_version": EXEC_PLAN_SCHEMA_VERSION,
        "hardware_class": hardware_class,
        "model_id": model_id,
        "target_soc": target,
        "sample_rate": main.sample_rate,
        "samples_per_frame": main.hop,
        "num_quantizers": main.num_quantizers,
        "codebook_size": main.codebook_size,
        "device_dir": device_dir,
        "artifacts": {
            role: {**entry, "step_contract": step_contract_summary(contracts[role])}
            for role, entry in artifacts.items()
        },
    }


def session_option(plan: dict[str, Any]) -> str:
    """The ``qwen3_tts.exec_plan=...`` session option: the plan's ``speech_decoder`` block as compact JSON."""
    return "qwen3_tts.exec_plan=" + json.dumps({"speech_decoder": plan["speech_decoder"]}, separators=(",", ":"))


def write_exec_plan(directory: str | os.PathLike[str], plan: dict[str, Any]) -> Path:
    return write_json_atomically(Path(directory) / EXEC_PLAN_NAME, plan)
