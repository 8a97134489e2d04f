"""Stateful step artifacts on a Rockchip NPU, behind the :class:`~.registry.StepRunner` interface.

- :class:`RknnLiteStepRunner`: a compiled ``.rknn`` on a board, through rknn-toolkit-lite2
  (``rknnlite.api.RKNNLite``: ``load_rknn`` -> ``init_runtime`` -> ``inference``).
- :class:`RknnSimulatorStepRunner`: the PC simulator of rknn-toolkit2 standing in for the board.
  The simulator cannot run a loaded ``.rknn`` file, so it compiles the artifact's ONNX source
  (recorded in the plan) for the plan's target and runs that: the same conversion, on this PC.

An ``.rknn`` carries no metadata, so the step contract comes from the plan. Inputs go in the
contract's order (``audio_codes``, ``freqs_in``, ``cache_valid``, ``cache_in``).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import EdgeError
from ..graphs.step_contract import StepContract
from ..plan.model import ExecPlan
from ..plan.schema import ExecPlanError
from .registry import RunnerOptions

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


class RknnLiteStepRunner:
    """A ``.rknn`` step on the board's NPU (rknn-toolkit-lite2)."""

    def __init__(self, path: str | os.PathLike[str], contract: StepContract, core_mask: int | None = None):
        try:
            from rknnlite.api import RKNNLite
        except ImportError as exc:
            raise EdgeError(
                "rknn-toolkit-lite2 is not installed: on the board, pip install the rknn_toolkit_lite2 wheel for "
                "its Python (from airockchip/rknn-toolkit2, rknn-toolkit-lite2/packages)"
            ) from exc
        self.path, self.contract = Path(path), contract
        self._rknn = RKNNLite()
        if self._rknn.load_rknn(str(self.path)) != 0:
            self.release()
            raise EdgeError(f"rknnlite could not load {self.path}; is it built for this SoC (see the plan's target)?")
        code = self._rknn.init_runtime() if core_mask is None else self._rknn.init_runtime(core_mask=core_mask)
        if code != 0:
            self.release()
            raise EdgeError(f"rknnlite init_runtime failed for {self.path} (returned {code}); is the NPU driver up?")

    def run(self, codes, freqs, cache_valid, cache):
        outputs = self._rknn.inference(inputs=[codes, freqs, cache_valid, cache])
        return _check_outputs(outputs, self.contract, self.path)

    def release(self) -> None:
        if self._rknn is not None:
            self._rknn.release()
            self._rknn = None


class RknnSimulatorStepRunner:
    """The rknn-toolkit2 PC simulator running ``onnx_path`` compiled for ``target`` (fp16), as on the board."""

    def __init__(self, onnx_path: str | os.PathLike[str], contract: StepContract, target: str, engine=None):
        self.path, self.contract = Path(onnx_path), contract
        if engine is None:
            from .rknn import build_engine

            self._workdir = tempfile.TemporaryDirectory(prefix="rknn-sim-")
            engine = build_engine(
                self.path,
                Path(self._workdir.name) / (self.path.stem + ".rknn"),
                target=target,
                simulate=True,
                inputs=contract.input_shapes(),
                outputs=contract.output_shapes(),
            )
        self.engine = engine
        self.step_inputs: list[np.ndarray] = []  # the first step's inputs, kept for accuracy_analysis

    def run(self, codes, freqs, cache_valid, cache):
        if not self.step_inputs:
            self.step_inputs = [codes, freqs, cache_valid, cache]
        return _check_outputs(self.engine.run([codes, freqs, cache_valid, cache]), self.contract, self.path)

    def release(self) -> None:
        self.engine.release()


class RknnBackend:
    """Opens each step of a plan on the board's NPU (rknnlite) or in the rknn-toolkit2 simulator."""

    name = "rknn"
    graph_kind = "stateful"

    def open_runner(
        self, plan: ExecPlan, role: str, options: RunnerOptions
    ) -> RknnLiteStepRunner | RknnSimulatorStepRunner:
        runtime = _choose_runtime(options.rknn_runtime)
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
