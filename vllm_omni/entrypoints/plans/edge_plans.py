"""The execution plans a ``vllm serve --omni`` server publishes, as its API server processes read them.

One directory per hardware class under ``--edge-artifacts``, plus the server's own CPU plan (the CPU
class of this machine, which decodes ``response_format`` pcm/wav) whether or not it is published.
The start-up hand-off builds or validates them first (:mod:`..cli.plan_builds`); an API server
process only loads them (sizes checked, not re-hashed) and never imports a builder or exporter.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import get_hardware_class
from vllm_omni.edge.plan.model import ExecPlan


class EdgeServingError(EdgeError):
    """The server cannot publish the plans it was asked for; the message says why and what to do."""


@dataclass(frozen=True)
class ServedPlans:
    """Published plans by class name, and the CPU plan the server decodes PCM with."""

    published: dict[str, ExecPlan]
    server_decoder: ExecPlan


def server_cpu_class() -> str:
    """The CPU class of this machine (its stateful ONNX plan decodes PCM on the server)."""
    return "cpu_arm64" if platform.machine().lower() in ("aarch64", "arm64") else "cpu_x86_64"


def parse_classes(value: str) -> list[str]:
    """``CLASS[,CLASS...]`` -> names, each checked against the registry (unknown names list the known ones)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise EdgeServingError("--edge-hardware names no class; `python -m vllm_omni.edge hardware list` shows them")
    for name in names:
        get_hardware_class(name)  # raises with the known names
    return list(dict.fromkeys(names))


def load_served_plans(classes: Sequence[str], artifacts: Path) -> ServedPlans:
    """What ``prepare_plans`` left, read again by each API server process (sizes checked, not re-hashed)."""
    artifacts = Path(artifacts)
    published = {name: ExecPlan.load(artifacts / name, check_sha256=False) for name in classes}
    cpu = server_cpu_class()
    decoder = published.get(cpu) or ExecPlan.load(artifacts / cpu, check_sha256=False)
    return ServedPlans(published, decoder)
