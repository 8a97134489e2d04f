"""What the edge routes of one API server process share, and how a process loads it.

Loading reads the plans that the start-up hand-off (``vllm serve --omni``, :mod:`.cli.serve`) built
or validated: sizes are checked, nothing is built or exported here, and no exporter is imported.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class EdgeServingState:
    """What the routes share: the plans, their JSON bytes, the frame generator on the engine, and an open
    decoder of the server's CPU plan that keeps its session loaded (each request opens its own decoder
    on that shared session at no cost: the onnxruntime backend shares graphs by file)."""

    plans: Any  # edge_plans.ServedPlans
    plan_bytes: dict[str, bytes]
    generator: Any  # speech.AsyncCodecFrameGenerator
    warm_decoder: Any = None

    def plan(self, name: str):
        """The published plan of class ``name``; an HTTP 404 naming the served classes otherwise."""
        from fastapi import HTTPException

        plan = self.plans.published.get(name)
        if plan is None:
            served = ", ".join(self.plans.published) or "none"
            raise HTTPException(404, f"hardware class {name!r} is not served here; served: {served}")
        return plan


def artifact_files(plan) -> dict[str, tuple[str, int]]:
    """Every file a device downloads for ``plan``: name -> (sha256, size)."""
    files = {a.file: (a.sha256, a.size_bytes) for a in plan.artifacts.values()}
    files |= {
        a.source["file"]: (a.source["sha256"], a.source["size_bytes"]) for a in plan.artifacts.values() if a.source
    }
    return files


async def load_edge_state(engine_client: Any, args: Any) -> EdgeServingState:
    """The state of one API server process: its plans (read, not built), the generator, a warm decoder."""
    from vllm_omni.edge.plan.model import PLAN_NAME
    from vllm_omni.edge.runtime import open_decoder

    from .edge_plans import load_served_plans
    from .speech import AsyncCodecFrameGenerator

    model = getattr(args, "model_tag", None) or args.model
    plans = load_served_plans(getattr(args, "edge_classes", []), Path(args.edge_artifacts))
    plan_bytes = {name: (p.directory / PLAN_NAME).read_bytes() for name, p in plans.published.items()}
    generator = await asyncio.to_thread(AsyncCodecFrameGenerator.for_engine, engine_client, model)
    # A long-lived server: weights repacked once for faster steps (prepack), and kept loaded.
    warm = await asyncio.to_thread(open_decoder, plans.server_decoder, check_sha256=False, prepack=True)
    return EdgeServingState(plans, plan_bytes, generator, warm)
