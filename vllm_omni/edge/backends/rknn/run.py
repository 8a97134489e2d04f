"""Stateful step artifacts on a Rockchip NPU, behind the :class:`~..interface.StepRunner` interface.

- :class:`RknnLiteStepRunner`: a compiled ``.rknn`` on a board, through rknn-toolkit-lite2
  (``rknnlite.api.RKNNLite``: ``load_rknn`` -> ``init_runtime`` -> ``inference``).
- :class:`RknnSimulatorStepRunner`: the PC simulator of rknn-toolkit2 standing in for the board.
  The simulator cannot run a loaded ``.rknn`` file, so it compiles the artifact's ONNX source
  (recorded in the plan) for the plan's target and runs that: the same conversion, on this PC.

An ``.rknn`` carries no metadata, so the step contract comes from the plan. Inputs go in the
contract's order (``audio_codes``, ``freqs_in``, ``cache_valid``, ``cache_in``).

Roles of a plan that name one ``.rknn`` (a graph built with rknn-toolkit2's ``dynamic_input`` for
the first and main step sizes, one copy of the weights) share one loaded model, as long as a runner
holds it. The step size is chosen by the inputs' shapes: ``RKNNLite.inference`` and the simulator's
``inference`` set the input shapes from the arrays they are given (rknn-toolkit-lite2's
``examples/dynamic_shape``; the C API's ``rknn_set_input_shapes``), and refuse a shape outside the
sets the file was built for.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import weakref
from pathlib import Path

import numpy as np

from ...errors import EdgeError
from ...graphs.step_contract import INPUT_NAMES, StepContract
from ...plan.model import ExecPlan
from ...plan.schema import ExecPlanError
from ..interface import LoadedWhileHeld, RunnerOptions

RKNN_RUNTIMES = ("auto", "board", "simulator")


def _check_outputs(outputs, contract: StepContract, source: Path) -> tuple[np.ndarray, np.ndarray]:
    if outputs is None or len(outputs) != 2:
        raise EdgeError(f"{source}: the NPU runtime returned {outputs!r:.80}, expected (audio_values, cache_out)")
    audio = np.asarray(outputs[0], dtype=np.float32).ravel()
    cache = np.asarray(outputs[1], dtype=np.float32).ravel()
    if audio.size != contract.step_frames * contract.samples_per_frame or cache.size != contract.cache_numel:
        raise EdgeError(
            f"{source}: the NPU runtime returned {audio.size} samples and a cache of {cache.size} floats; the plan's "
            f"contract says {contract.step_frames * contract.samples_per_frame} and {contract.cache_numel}: the "
            "artifact does not match its plan, rebuild it"
        )
    return audio, cache


class RknnLiteModel:
    """A ``.rknn`` loaded on the board's NPU (rknn-toolkit-lite2); released when the last holder lets go."""

    def __init__(self, path: str | os.PathLike[str], core_mask: int | None = None):
        try:
            from rknnlite.api import RKNNLite
        except ImportError as exc:
            raise EdgeError(
                "rknn-toolkit-lite2 is not installed: on the board, pip install the rknn_toolkit_lite2 wheel for "
                "its Python (from airockchip/rknn-toolkit2, rknn-toolkit-lite2/packages)"
            ) from exc
        self.path = Path(path)
        rknn = RKNNLite()
        self._release = weakref.finalize(self, rknn.release)
        if rknn.load_rknn(str(self.path)) != 0:
            self._release()
            raise EdgeError(f"rknnlite could not load {self.path}; is it built for this SoC (see the plan's target)?")
        code = rknn.init_runtime() if core_mask is None else rknn.init_runtime(core_mask=core_mask)
        if code != 0:
            self._release()
            raise EdgeError(f"rknnlite init_runtime failed for {self.path} (returned {code}); is the NPU driver up?")
        self.rknn = rknn

    def run(self, inputs: list[np.ndarray]):
        return self.rknn.inference(inputs=inputs)


class RknnLiteStepRunner:
    """A ``.rknn`` step on the board's NPU (rknn-toolkit-lite2), at its contract's step size.

    ``model``: an :class:`RknnLiteModel` of ``path`` that other roles share (a ``dynamic_input``
    file); without it the runner loads its own.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        contract: StepContract,
        core_mask: int | None = None,
        model: RknnLiteModel | None = None,
    ):
        self.path, self.contract = Path(path), contract
        self.model: RknnLiteModel | None = model or RknnLiteModel(self.path, core_mask)

    def run(self, codes, freqs, cache_valid, cache):
        if self.model is None:
            raise EdgeError(f"{self.path}: this runner was released")
        return _check_outputs(self.model.run([codes, freqs, cache_valid, cache]), self.contract, self.path)

    def release(self) -> None:
        """Let go of the model (it is released with its last holder)."""
        self.model = None


def shape_sets(contracts: list[StepContract]) -> list[list[list[int]]] | None:
    """rknn-toolkit2's ``dynamic_input`` for a graph run at each contract's step size (``None``: one size)."""
    by_frames = {contract.step_frames: contract for contract in contracts}
    if len(by_frames) < 2:
        return None
    return [[by_frames[frames].input_shapes()[name] for name in INPUT_NAMES] for frames in sorted(by_frames)]


class SimulatedModel:
    """``onnx_path`` compiled for ``target`` (fp16) and loaded in the rknn-toolkit2 PC simulator, for the
    step sizes of ``contracts`` (several: one ``dynamic_input`` build, as the plan's shared ``.rknn``)."""

    def __init__(self, onnx_path: str | os.PathLike[str], contracts: list[StepContract], target: str):
        from .convert import build_engine

        self.path = Path(onnx_path)
        self._workdir = tempfile.TemporaryDirectory(prefix="rknn-sim-")
        largest = max(contracts, key=lambda contract: contract.step_frames)
        self.engine = build_engine(
            self.path,
            Path(self._workdir.name) / (self.path.stem + ".rknn"),
            target=target,
            simulate=True,
            inputs=largest.input_shapes(),
            outputs=largest.output_shapes(),
            shape_sets=shape_sets(contracts),
        )
        self._release = weakref.finalize(self, self.engine.release)


class RknnSimulatorStepRunner:
    """The rknn-toolkit2 PC simulator running ``onnx_path`` compiled for ``target`` (fp16), as on the board.

    ``engine``: an already built engine (the converter's check), or a :class:`SimulatedModel` that
    other roles share; without either, the runner compiles the graph for its own step size.
    """

    def __init__(self, onnx_path: str | os.PathLike[str], contract: StepContract, target: str, engine=None):
        self.path, self.contract = Path(onnx_path), contract
        if engine is None:
            engine = SimulatedModel(self.path, [contract], target)
        self._model = engine if isinstance(engine, SimulatedModel) else None  # held while this runner lives
        self.engine = engine.engine if isinstance(engine, SimulatedModel) else engine
        self.step_inputs: list[np.ndarray] = []  # the first step's inputs, kept for accuracy_analysis

    def run(self, codes, freqs, cache_valid, cache):
        if not self.step_inputs:
            self.step_inputs = [codes, freqs, cache_valid, cache]
        return _check_outputs(self.engine.run([codes, freqs, cache_valid, cache]), self.contract, self.path)

    def release(self) -> None:
        """Release an engine of its own; a shared :class:`SimulatedModel` goes with its last holder."""
        if self._model is None:
            self.engine.release()
        self._model = None


class RknnBackend:
    """Opens each step of a plan on the board's NPU (rknnlite) or in the rknn-toolkit2 simulator.

    Roles that name one ``.rknn`` share one loaded model (one copy of the weights) while a runner
    holds it; in the simulator, the shared ONNX source is compiled once for all their step sizes.
    """

    name = "rknn"
    graph_kind = "stateful"

    def __init__(self) -> None:
        self._models = LoadedWhileHeld()

    def open_runner(
        self, plan: ExecPlan, role: str, options: RunnerOptions
    ) -> RknnLiteStepRunner | RknnSimulatorStepRunner:
        runtime = _choose_runtime(options.rknn_runtime)
        contract = plan.step_contract(role)
        artifact = plan.artifacts[role]
        if runtime == "board":
            path = plan.path(role)
            model = self._models.get(("board", str(path.resolve()), artifact.sha256), lambda: RknnLiteModel(path))
            return RknnLiteStepRunner(path, contract, model=model)
        source = artifact.source
        if source is None:
            raise ExecPlanError(
                f"artifacts.{role}.source: the simulator compiles the artifact's ONNX source, and this plan records "
                "none; rebuild with `python -m vllm_omni.edge build --hardware rockchip_npu`"
            )
        sharing = [other for other, shared in plan.artifacts.items() if shared.file == artifact.file]
        contracts = [plan.step_contract(other) for other in sharing]
        onnx_path = plan.directory / source["file"]
        model = self._models.get(
            ("simulator", str(onnx_path.resolve()), artifact.sha256, plan.target),
            lambda: SimulatedModel(onnx_path, contracts, plan.target),
        )
        return RknnSimulatorStepRunner(onnx_path, contract, plan.target, engine=model)


def _choose_runtime(runtime: str) -> str:
    if runtime not in RKNN_RUNTIMES:
        raise EdgeError(f"unknown rknn runtime {runtime!r}; choose one of {', '.join(RKNN_RUNTIMES)}")
    if runtime != "auto":
        return runtime
    if importlib.util.find_spec("rknnlite") is not None:
        return "board"
    if importlib.util.find_spec("rknn") is not None:
        return "simulator"
    raise EdgeError(
        "this plan runs on a Rockchip NPU: install rknn-toolkit-lite2 on the board, or run in the converter "
        "venv (make setup-rknn) to use the rknn-toolkit2 simulator"
    )
