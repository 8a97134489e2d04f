"""Open the decoder an execution plan describes: one :class:`~.protocol.StreamDecoder` for every class.

    decoder = open_decoder("out/plans/cpu_x86_64")      # a plan directory or exec_plan.json
    pcm = decoder.feed(frames)                           # int codes [T, Q] -> float32 PCM
    pcm_tail = decoder.flush()

The plan's ``backend`` names a backend in :mod:`..backends.registry` (built in: onnxruntime,
rknn and executorch for stateful plans, executorch and torch_export for windowed ones; plugins add more), whose
``open_runner`` opens a runner per artifact; the runners drive a :class:`StatefulDecoder` or a
:class:`WindowedDecoder`. The plan is validated first (schema, contracts, every file's size and
sha256), so a runtime never sees a file the plan does not vouch for. No torch here: a backend
imports its own runtime package when it opens a runner.
"""

from __future__ import annotations

import os

from ..backends.interface import BackendUnavailableError, RunnerOptions, graph_kinds
from ..backends.registry import get_backend
from ..plan.model import ExecPlan
from ..plan.schema import ExecPlanError
from .protocol import StreamDecoder
from .stateful_decoder import StatefulDecoder
from .windowed_decoder import WindowedDecoder


def open_decoder(
    plan: ExecPlan | str | os.PathLike[str],
    *,
    rknn_runtime: str = "auto",
    threads: int | None = None,
    check_sha256: bool = True,
    prepack: bool = False,
) -> StreamDecoder:
    """The stream decoder of ``plan``. ``rknn_runtime``: ``board`` (rknnlite), ``simulator`` or ``auto``.

    ``prepack``: onnxruntime repacks weights at open (faster steps, slower open; see :class:`RunnerOptions`).
    """
    if not isinstance(plan, ExecPlan):
        plan = ExecPlan.load(plan, check_sha256=check_sha256)
    try:
        backend = get_backend(plan.backend)
    except BackendUnavailableError as exc:
        raise ExecPlanError(f"no decoder runtime for backend {plan.backend!r} ({plan.graph_kind}): {exc}") from exc
    if plan.graph_kind not in graph_kinds(backend):
        raise ExecPlanError(
            f"backend {plan.backend!r} runs {' and '.join(graph_kinds(backend))} graphs; the plan is "
            f"{plan.graph_kind}: rebuild it"
        )
    options = RunnerOptions(threads=threads, rknn_runtime=rknn_runtime, prepack=prepack)
    runners = {role: backend.open_runner(plan, role, options) for role in plan.artifacts}
    if plan.graph_kind == "windowed":
        return WindowedDecoder(
            {runner.window: runner for runner in runners.values()},
            ramp=tuple(plan.windowed["ramp"]),
            context_frames=int(plan.windowed["context_frames"]),
            codec=plan.codec,
        )
    return StatefulDecoder(runners["main"], runners.get("first"))
