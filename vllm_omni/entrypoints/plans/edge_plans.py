"""The execution plans a ``vllm serve --omni`` server publishes, as its API server processes read them.

One directory per hardware class under ``--edge-artifacts``, plus the server's own CPU plan (the CPU
class of this machine, which decodes ``response_format`` pcm/wav) whether or not it is published.
The start-up hand-off builds or validates them first (:mod:`..cli.plan_builds`); an API server
process only loads them (sizes checked, not re-hashed) and never imports a builder or exporter.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import get_hardware_class
from vllm_omni.edge.plan.model import PLAN_NAME, ExecPlan
from vllm_omni.errors import RequestRefused


class EdgeServingError(EdgeError):
    """The server cannot publish the plans it was asked for; the message says why and what to do."""


@dataclass(frozen=True)
class ServedPlans:
    """The plans feature of one API server process: published plans by class name (and each plan file's bytes, as
    served), and the CPU plan the server decodes PCM with."""

    published: dict[str, ExecPlan]
    server_decoder: ExecPlan
    plan_bytes: dict[str, bytes] = field(default_factory=dict)

    def plan(self, name: str) -> ExecPlan:
        """The published plan of class ``name``; a 404 naming the served classes otherwise (the plan routes answer
        it, a WebSocket closes with its text and code 4404)."""
        plan = self.published.get(name)
        if plan is None:
            served = ", ".join(self.published) or "none"
            raise RequestRefused(f"hardware class {name!r} is not served here; served: {served}", 404)
        return plan


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
    plan_bytes = {name: (plan.directory / PLAN_NAME).read_bytes() for name, plan in published.items()}
    return ServedPlans(published, decoder, plan_bytes)
