"""Open the decoder an execution plan describes: one ``feed`` / ``flush`` / ``reset`` object for every class.

    decoder = open_decoder("out/plans/cpu_x86_64")      # a plan directory or exec_plan.json
    pcm = decoder.feed(frames)                           # int codes [T, Q] -> float32 PCM
    pcm_tail = decoder.flush()

=============  ==================================================================================
backend        decoder
=============  ==================================================================================
onnxruntime    :class:`StatefulDecoder` over :class:`OnnxStepRunner` (each graph's own contract must equal the plan's)
rknn           :class:`StatefulDecoder` over rknn-toolkit-lite2 on a board, or the rknn-toolkit2 simulator
executorch     :class:`WindowedDecoder` over ``.pte`` programs in the ExecuTorch runtime
torch_export   :class:`WindowedDecoder` over ``.pt2`` programs
=============  ==================================================================================

The plan is validated first (schema, contracts, every file's size and sha256), so a runtime
never sees a file the plan does not vouch for.
"""

from __future__ import annotations

import importlib.util
import os

from ..errors import EdgeError
from ..plan import ExecPlan, ExecPlanError
from .stateful_decoder import StatefulDecoder
from .windowed_decoder import WindowedDecoder

RKNN_RUNTIMES = ("auto", "board", "simulator")


def open_decoder(
    plan: ExecPlan | str | os.PathLike[str],
    *,
    rknn_runtime: str = "auto",
    threads: int | None = None,
    check_sha256: bool = True,
) -> StatefulDecoder | WindowedDecoder:
    """The stream decoder of ``plan``. ``rknn_runtime``: ``board`` (rknnlite), ``simulator`` or ``auto``."""
    if not isinstance(plan, ExecPlan):
        plan = ExecPlan.load(plan, check_sha256=check_sha256)
    if plan.graph_kind == "windowed":
        return _windowed(plan)
    if plan.backend == "onnxruntime":
        return _stateful(plan, _onnx_runner(plan, threads))
    if plan.backend == "rknn":
        return _stateful(plan, _rknn_runner(plan, rknn_runtime))
    raise ExecPlanError(f"no decoder runtime for backend {plan.backend!r} ({plan.graph_kind})")


def _windowed(plan: ExecPlan) -> WindowedDecoder:
    from .window_programs import WINDOW_RUNNERS, expected_metadata

    runners = {}
    for window in plan.schedule:
        expected = expected_metadata(window, plan.samples_per_frame, plan.num_quantizers, plan.sample_rate)
        runners[window] = WINDOW_RUNNERS[plan.backend](plan.path(window.name), window, expected)
    return WindowedDecoder(
        runners,
        ramp=tuple(plan.windowed["ramp"]),
        context_frames=int(plan.windowed["context_frames"]),
        num_quantizers=plan.num_quantizers,
        codebook_size=plan.codebook_size,
        samples_per_frame=plan.samples_per_frame,
        sample_rate=plan.sample_rate,
    )


def _stateful(plan: ExecPlan, make_runner) -> StatefulDecoder:
    runners = {role: make_runner(role) for role in plan.artifacts}
    return StatefulDecoder(runners["main"], runners.get("first"))


def _onnx_runner(plan: ExecPlan, threads: int | None):
    from .onnx_step import OnnxStepRunner

    def make(role: str) -> OnnxStepRunner:
        runner = OnnxStepRunner(plan.path(role), threads=threads)
        expected = plan.step_contract(role)
        if runner.contract != expected:
            fields = [
                name
                for name in ("step_frames", "cache_numel", "head_dim", "kv_slots", "hop", "num_quantizers", "layout")
                if getattr(runner.contract, name) != getattr(expected, name)
            ] or ["rope_inv_freq/geometry"]
            raise ExecPlanError(
                f"artifacts.{role}: {plan.artifacts[role].file} describes itself differently from the plan's contract "
                f"({', '.join(fields)}); the plan was written for another graph: rebuild it"
            )
        return runner

    return make


def _rknn_runner(plan: ExecPlan, runtime: str):
    from .rknn_step import RknnLiteStepRunner, RknnSimulatorStepRunner

    if runtime not in RKNN_RUNTIMES:
        raise EdgeError(f"unknown rknn runtime {runtime!r}; choose one of {', '.join(RKNN_RUNTIMES)}")
    if runtime == "auto":
        if importlib.util.find_spec("rknnlite") is not None:
            runtime = "board"
        elif importlib.util.find_spec("rknn") is not None:
            runtime = "simulator"
        else:
            raise EdgeError(
                "this plan runs on a Rockchip NPU: install rknn-toolkit-lite2 on the board, or run in the converter "
                "venv (make setup-rknn) to use the rknn-toolkit2 simulator"
            )

    def make(role: str):
        contract = plan.step_contract(role)
        if runtime == "board":
            return RknnLiteStepRunner(plan.path(role), contract)
        source = plan.artifacts[role].source
        if source is None:
            raise ExecPlanError(
                f"artifacts.{role}.source: the simulator compiles the artifact's ONNX source, and this plan records "
                "none; rebuild with `python -m vllm_omni.edge build --hardware rockchip_npu`"
            )
        return RknnSimulatorStepRunner(plan.directory / source["file"], contract, plan.target)

    return make
