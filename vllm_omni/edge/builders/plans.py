"""What the builders share at the end: the plan written, then read back validated (:func:`write_and_load`)."""

from __future__ import annotations

from ..plan.model import ExecPlan
from .request import BuildRequest


def write_and_load(plan: ExecPlan, request: BuildRequest) -> ExecPlan:
    """Write ``plan`` into ``request.out_dir`` and read it back through full validation (but the sha256s)."""
    path = plan.write(request.out_dir)
    loaded = ExecPlan.load(path, check_sha256=False)  # sha256s were computed from these files in this build
    request.progress(f"wrote {path}: plan {loaded.plan_id[:12]}, {len(loaded.artifacts)} artifacts, validated")
    return loaded
