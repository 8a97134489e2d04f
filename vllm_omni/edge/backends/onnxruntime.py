"""Stateful step graphs (ONNX) run by onnxruntime: the CPU classes' backend (numpy in, numpy out; no torch)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import EdgeError
from ..graphs.step_contract import INPUT_NAMES, OUTPUT_NAMES, StepContract
from ..plan.model import ExecPlan
from ..plan.schema import ExecPlanError
from .registry import RunnerOptions


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError as exc:
        raise EdgeError("onnxruntime is not installed: pip install 'vllm-omni-edge[onnx]' (or onnxruntime)") from exc
    return onnxruntime


class OnnxStepRunner:
    """Loads one step graph; its :class:`StepContract` comes from the graph's own metadata."""

    def __init__(self, path: str | os.PathLike[str], threads: int | None = None):
        ort = _onnxruntime()
        self.path = Path(path)
        if not self.path.is_file():
            raise EdgeError(f"no step graph at {self.path}")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise EdgeError(f"onnxruntime cannot load {self.path}: {exc}. Re-export the step graph.") from exc
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.contract = StepContract.from_metadata(metadata, source=str(self.path))
        names = tuple(i.name for i in self.session.get_inputs()), tuple(o.name for o in self.session.get_outputs())
        if names != (INPUT_NAMES, OUTPUT_NAMES):
            raise EdgeError(f"{self.path}: expected inputs {INPUT_NAMES} and outputs {OUTPUT_NAMES}, found {names}")

    def run(
        self, codes: np.ndarray, freqs: np.ndarray, cache_valid: np.ndarray, cache: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        audio, cache_out = self.session.run(
            None, {"audio_codes": codes, "freqs_in": freqs, "cache_valid": cache_valid, "cache_in": cache}
        )
        return audio, cache_out


class OnnxRuntimeBackend:
    """Opens each step of a plan in onnxruntime; the graph's own contract must equal the plan's."""

    name = "onnxruntime"
    graph_kind = "stateful"

    def open_runner(self, plan: ExecPlan, role: str, options: RunnerOptions) -> OnnxStepRunner:
        runner = OnnxStepRunner(plan.path(role), threads=options.threads)
        expected = plan.step_contract(role)
        if runner.contract != expected:
            fields = [
                name
                for name in (
                    "step_frames",
                    "cache_numel",
                    "head_dim",
                    "kv_slots",
                    "samples_per_frame",
                    "num_quantizers",
                    "layout",
                )
                if getattr(runner.contract, name) != getattr(expected, name)
            ] or ["rope_inv_freq/geometry"]
            raise ExecPlanError(
                f"artifacts.{role}: {plan.artifacts[role].file} describes itself differently from the plan's contract "
                f"({', '.join(fields)}); the plan was written for another graph: rebuild it"
            )
        return runner
