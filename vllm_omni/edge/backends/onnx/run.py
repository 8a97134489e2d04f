"""Stateful step graphs (ONNX) run by onnxruntime: the CPU classes' backend (numpy in, numpy out; no torch).

One :class:`OnnxStepGraph` is one onnxruntime session, so one copy of the weights in memory. A
dynamic graph (``max_step_frames``) serves every step size of a plan: its first and main roles
are two :class:`OnnxStepRunner` views of the same session.

Opening fast: onnxruntime's full optimization of a 457 MB graph (NCHWc layout, fusions) takes
seconds. The first open of a graph on a device saves the optimized model in the device cache
(:mod:`.session_cache`); later opens load it with optimization off and memory-mapped weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...errors import EdgeError
from ...graphs.step_contract import INPUT_NAMES, OUTPUT_NAMES, StepContract
from ...plan.model import ExecPlan
from ...plan.schema import ExecPlanError
from ..interface import LoadedWhileHeld, RunnerOptions
from .session_cache import CPU, OptimizedModelCache, onnxruntime_module, session_options


class OnnxStepGraph:
    """One step graph in one onnxruntime session; its :class:`StepContract` comes from the graph's own metadata.

    ``cache``: where the optimized model is kept between starts (``None``: optimize in memory at every
    open). ``sha256``: the graph's verified digest (with its external data's: ``PlanArtifact.content_sha256``), the
    cache's key (required with ``cache``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        threads: int | None = None,
        cache: OptimizedModelCache | None = None,
        sha256: str | None = None,
        prepack: bool = False,
    ):
        ort = onnxruntime_module()
        self.path = Path(path)
        if not self.path.is_file():
            raise EdgeError(f"no step graph at {self.path}")
        try:
            if cache is not None and sha256 is not None:
                self.session, self.cached = cache.session(self.path, sha256, threads, prepack)
            else:
                options = session_options(threads, prepack=prepack)
                self.session = ort.InferenceSession(str(self.path), options, providers=CPU)
                self.cached = False
        except EdgeError:
            raise
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise EdgeError(f"onnxruntime cannot load {self.path}: {exc}. Re-export the step graph.") from exc
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.contract = StepContract.from_metadata(metadata, source=str(self.path))
        names = tuple(i.name for i in self.session.get_inputs()), tuple(o.name for o in self.session.get_outputs())
        if names != (INPUT_NAMES, OUTPUT_NAMES):
            raise EdgeError(f"{self.path}: expected inputs {INPUT_NAMES} and outputs {OUTPUT_NAMES}, found {names}")

    def runner(self, step_frames: int | None = None) -> OnnxStepRunner:
        return OnnxStepRunner(self, step_frames=step_frames)


class OnnxStepRunner:
    """Runs a step graph at one step size (default: the graph's own); several runners may share one graph."""

    def __init__(
        self, graph: OnnxStepGraph | str | os.PathLike[str], threads: int | None = None, step_frames: int | None = None
    ):
        self.graph = graph if isinstance(graph, OnnxStepGraph) else OnnxStepGraph(graph, threads=threads)
        self.path, self.session = self.graph.path, self.graph.session
        contract = self.graph.contract
        self.contract = contract if step_frames is None else contract.for_frames(step_frames)

    def run(
        self, codes: np.ndarray, freqs: np.ndarray, cache_valid: np.ndarray, cache: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        audio, cache_out = self.session.run(
            None, {"audio_codes": codes, "freqs_in": freqs, "cache_valid": cache_valid, "cache_in": cache}
        )
        return audio, cache_out


class OnnxRuntimeBackend:
    """Opens each step of a plan in onnxruntime; the graph's own contract must equal the plan's.

    Roles that name the same file share one :class:`OnnxStepGraph` (one session, one copy of the
    weights) for as long as a decoder holds it.
    """

    name = "onnxruntime"
    graph_kind = "stateful"

    def __init__(self) -> None:
        self._graphs = LoadedWhileHeld()

    def open_graph(self, plan: ExecPlan, role: str, options: RunnerOptions) -> OnnxStepGraph:
        artifact, path = plan.artifacts[role], plan.path(role)
        key = (str(path.resolve()), artifact.content_sha256, options.threads, options.prepack)
        return self._graphs.get(
            key,
            lambda: OnnxStepGraph(
                path, options.threads, OptimizedModelCache.default(), artifact.content_sha256, options.prepack
            ),
        )

    def open_runner(self, plan: ExecPlan, role: str, options: RunnerOptions) -> OnnxStepRunner:
        graph = self.open_graph(plan, role, options)
        expected = plan.step_contract(role)
        if not graph.contract.same_graph(expected):
            fields = [
                name
                for name in (
                    "step_frames",
                    "max_step_frames",
                    "cache_numel",
                    "head_dim",
                    "kv_slots",
                    "samples_per_frame",
                    "num_quantizers",
                    "layout",
                )
                if getattr(graph.contract, name) != getattr(expected, name)
            ] or ["rope_inv_freq/geometry"]
            raise ExecPlanError(
                f"artifacts.{role}: {plan.artifacts[role].file} describes itself differently from the plan's contract "
                f"({', '.join(fields)}); the plan was written for another graph: rebuild it"
            )
        return graph.runner(expected.step_frames)
