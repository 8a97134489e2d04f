"""Run ``.pte`` files in the ExecuTorch runtime: loading, the window and step runners, threads, the backend.

A program is loaded once per process while a runner holds it (:func:`shared_program`), so the roles of a
plan that name one file share its weights. :func:`profile_outside_time` runs a method with the ETDump
profiler to time the operators left outside the delegate (:mod:`.delegation`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ...graphs.step_contract import StepContract, StepContractError
from ...graphs.window_contract import WindowContract
from ...plan.model import ExecPlan
from ...plan.schema import ExecPlanError
from ..interface import LoadedWhileHeld, RunnerOptions
from ..window_programs import WindowProgramBackend, check_program_metadata
from .delegation import op_kind
from .export import ExecuTorchProgramWriter
from .program import (
    CPUINFO_NOISE,
    METADATA_SEPARATOR,
    SINGLE_METHOD,
    STEP_CONTRACT_KEY,
    metadata_method,
    native_stderr_without,
    quiet_executorch_import,
)
from .xnnpack_options import share_packed_weights


class LoadedProgram:
    """A program in the runtime's bindings (``executorch.extension.pybindings._C``), as ``executorch.runtime`` holds it.

    ``executorch.runtime`` (and ``portable_lib``) import the exporter with it: 136 MiB more resident
    memory in a process that only decodes. The bindings need torch's libraries loaded first.
    """

    def __init__(self, program: Any):
        self._program = program
        self.method_names = {program.get_method_name(index) for index in range(program.num_methods())}
        self._methods: dict[str, LoadedMethod] = {}

    def load_method(self, name: str) -> LoadedMethod:
        """The method ``name``, loaded once (its delegates initialised, XNNPACK's weights packed)."""
        if name not in self._methods:
            self._methods[name] = LoadedMethod(self._program.load_method(name))
        return self._methods[name]

    def write_etdump_result_to_file(self, etdump_path: str, debug_buffer_path: str) -> None:
        self._program.write_etdump_result_to_file(etdump_path, debug_buffer_path)


class LoadedMethod:
    def __init__(self, method: Any):
        self._method = method

    def execute(self, inputs: list[Any]) -> list[Any]:
        return list(self._method(inputs))


def load_program(path: str | os.PathLike[str], *, enable_etdump: bool = False) -> LoadedProgram:
    """A ``.pte`` loaded in the ExecuTorch runtime (XNNPACK registered); methods load on demand.

    ``enable_etdump``: record the runtime's profiling events (:func:`profile_outside_time`).
    """
    import torch  # noqa: F401  (loads libtorch, which the bindings link against)

    with quiet_executorch_import(), native_stderr_without(CPUINFO_NOISE):
        from executorch.extension.pybindings import _C

        share_packed_weights()  # one packed copy of the weights for all methods (xnnpack_options)
        try:
            program = _C._load_program(
                str(path),
                enable_etdump=enable_etdump,
                debug_buffer_size=0,
                program_verification=_C.Verification.InternalConsistency,
            )
        except (RuntimeError, ValueError) as exc:
            raise ExecPlanError(f"the ExecuTorch runtime cannot load {path} ({exc}); copy it again or rebuild") from exc
    return LoadedProgram(program)


def program_metadata(program: Any, method: str) -> dict[str, Any]:
    """The constant methods describing ``method`` of a loaded program, by key.

    ``forward`` of a single-method program: every other method without ``__`` in its name;
    any other method ``m``: the methods ``m__key``.
    """
    if method == SINGLE_METHOD:
        names = {name: name for name in program.method_names if name != method and METADATA_SEPARATOR not in name}
    else:
        prefix = f"{method}{METADATA_SEPARATOR}"
        names = {name.removeprefix(prefix): name for name in program.method_names if name.startswith(prefix)}
    metadata = {}
    with native_stderr_without(CPUINFO_NOISE):
        for key, name in sorted(names.items()):
            (metadata[key],) = program.load_method(name).execute([])
    return metadata


def load_pte(
    path: str | os.PathLike[str], method: str = SINGLE_METHOD, program: Any | None = None
) -> tuple[Any, dict[str, int]]:
    """``(method, its integer metadata)`` of a ``.pte`` (or of ``program``, already loaded from it)."""
    program = program if program is not None else load_program(path)
    if method not in program.method_names:
        raise ExecPlanError(
            f"{path} has no method {method!r} (it has {sorted(program.method_names)[:8]}); the plan was written for "
            "another program: rebuild it"
        )
    metadata = {
        key: int(value) for key, value in program_metadata(program, method).items() if not isinstance(value, str)
    }
    with native_stderr_without(CPUINFO_NOISE):
        return program.load_method(method), metadata


class ExecuTorchWindowRunner:
    """A ``.pte`` window in the ExecuTorch runtime. Inputs and outputs cross as torch tensors (its API)."""

    def __init__(
        self, path: str | os.PathLike[str], contract: WindowContract, method: str = SINGLE_METHOD, program: Any = None
    ):
        import torch

        self._torch = torch
        self.window = contract.window
        self.path = Path(path)
        self._method, metadata = load_pte(self.path, method, program)
        self._program = program  # a shared program stays loaded while its runners live
        check_program_metadata(contract, metadata, self.path)

    def run(self, codes: np.ndarray) -> np.ndarray:
        (audio,) = self._method.execute([self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))])
        return audio.numpy().ravel()


def step_contract_of(program: Any, method: str, source: str) -> StepContract:
    """The step contract ``method`` of a loaded program carries (its ``{method}__step_contract()``)."""
    name = metadata_method(method, STEP_CONTRACT_KEY)
    if method not in program.method_names or name not in program.method_names:
        raise StepContractError(
            f"{source}: no stateful step method {method!r} with its {name}() contract (methods: "
            f"{sorted(program.method_names)[:8]}); it is not a step program exported by vllm_omni.edge: rebuild it"
        )
    with native_stderr_without(CPUINFO_NOISE):
        (text,) = program.load_method(name).execute([])
    try:
        row = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StepContractError(f"{source}: {name}() is not JSON ({str(exc)[:80]}); rebuild the program") from exc
    return StepContract.from_json(row, source=f"{source}:{method}")


class ExecuTorchStepRunner:
    """One stateful step method of a ``.pte`` in the ExecuTorch runtime; its contract comes from the program.

    Arrays cross as torch tensors (the runtime's Python API). The runtime copies outputs out of its
    planned memory on every call (methods of one program share those arenas), so the cache a step
    returns is the caller's.
    """

    def __init__(self, path: str | os.PathLike[str], method: str, program: Any | None = None):
        import torch

        self._torch = torch
        self.path = Path(path)
        self.method_name = method
        program = program if program is not None else load_program(self.path)
        self.contract = step_contract_of(program, method, str(self.path))
        with native_stderr_without(CPUINFO_NOISE):
            self._method = program.load_method(method)
        self._program = program  # keeps the program (and its data) alive while the method runs

    def run(
        self, codes: np.ndarray, freqs: np.ndarray, cache_valid: np.ndarray, cache: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        inputs = [
            self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)),
            self._torch.from_numpy(np.ascontiguousarray(freqs, dtype=np.float32)),
            self._torch.from_numpy(np.ascontiguousarray(cache_valid, dtype=np.float32)),
            self._torch.from_numpy(np.ascontiguousarray(cache, dtype=np.float32)),
        ]
        audio, cache_out = self._method.execute(inputs)
        return audio.numpy(), cache_out.numpy()


class ExecuTorchBackend(WindowProgramBackend):
    """Windowed programs and stateful step programs in the ExecuTorch runtime.

    A windowed role runs the method its plan row names (``forward`` when none); a stateful role
    runs its step method, whose own contract must equal the plan's. Roles naming one file share
    one loaded program (one copy of the weights in memory).
    """

    graph_kinds = ("windowed", "stateful")

    def open_window_runner(self, path: Path, contract: WindowContract, method: str | None = None) -> Any:
        if method is None:
            return ExecuTorchWindowRunner(path, contract)
        return ExecuTorchWindowRunner(path, contract, method, program=shared_program(Path(path)))

    def open_runner(self, plan: ExecPlan, role: str, options: RunnerOptions) -> Any:
        artifact = plan.artifacts[role]
        method = artifact.method or SINGLE_METHOD
        if options.threads is not None:
            set_threads(options.threads)
        if plan.graph_kind == "windowed":
            window = {window.name: window for window in plan.schedule}[role]
            contract = WindowContract(window, plan.codec)
            return ExecuTorchWindowRunner(plan.path(role), contract, method, program=_shared_program(plan, role))
        runner = ExecuTorchStepRunner(plan.path(role), method, program=_shared_program(plan, role))
        expected = plan.step_contract(role)
        if runner.contract != expected:
            raise ExecPlanError(
                f"artifacts.{role}: method {method} of {artifact.file} describes itself differently from the plan's "
                f"contract (B {runner.contract.step_frames} vs {expected.step_frames}, N {runner.contract.cache_numel} "
                f"vs {expected.cache_numel}); the plan was written for another program: rebuild it"
            )
        return runner


_THREADS_SET: list[int] = []


def set_threads(threads: int) -> None:
    """Size the runtime's thread pool, once per process (XNNPACK's kernels in every loaded program use it).

    Resizing it while another method runs is unsafe (the runtime's own word): a later call asking for
    another size keeps the first and says so.
    """
    if threads < 1:
        raise ExecPlanError(f"threads must be >= 1, found {threads}")
    if _THREADS_SET:
        if _THREADS_SET[0] != threads:
            logging.getLogger(__name__).warning(
                "the ExecuTorch thread pool of this process already has %d threads; keeping it (asked for %d)",
                _THREADS_SET[0],
                threads,
            )
        return
    with quiet_executorch_import(), native_stderr_without(CPUINFO_NOISE):
        import torch  # noqa: F401  (loads libtorch, which the bindings link against)
        from executorch.extension.pybindings import _C

        if _C._threadpool_get_thread_count() != threads:
            _C._unsafe_reset_threadpool(threads)
    _THREADS_SET.append(threads)


# Programs loaded while some runner still holds them, by (file, identity): the methods of one file share one.
_LOADED_PROGRAMS = LoadedWhileHeld()


def shared_program(path: Path, identity: str | None = None) -> Any:
    """The program at ``path``, loaded once for every runner (method) that opens it while one is alive.

    ``identity`` tells versions of the file apart (a plan's sha256); by default its size and mtime.
    """
    if identity is None:
        stat = path.stat()
        identity = f"{stat.st_size}:{stat.st_mtime_ns}"
    return _LOADED_PROGRAMS.get((str(path.resolve()), identity), lambda: load_program(path))


def _shared_program(plan: ExecPlan, role: str) -> Any:
    return shared_program(plan.path(role), plan.artifacts[role].sha256)


# Windowed programs and stateful steps as ExecuTorch ``.pte`` files, lowered with a delegate partitioner.
BACKEND = ExecuTorchBackend("executorch", "xnnpack", ExecuTorchProgramWriter, ExecuTorchWindowRunner)


def profile_outside_time(path: Path, method: str, inputs: list[Any], runs: int = 3) -> tuple[dict[str, float], float]:
    """``({kind: seconds per call}, step seconds)`` of ``method`` of the program at ``path``, from ETDump.

    Runs the method ``runs`` times after one warm-up, in the ExecuTorch runtime with its event
    tracer on; the portable kernels' events (``native_call_<op>``) are the operators outside the
    delegate, ``Method::execute`` the whole step.
    """
    from executorch.devtools import Inspector

    with quiet_executorch_import(), native_stderr_without(CPUINFO_NOISE):
        program = load_program(path, enable_etdump=True)
        loaded = program.load_method(method)
        loaded.execute(inputs)  # warm-up (XNNPACK packs its weights on the first call)
        for _ in range(runs):
            loaded.execute(inputs)
        with tempfile.TemporaryDirectory() as scratch:
            etdump = Path(scratch) / "profile.etdp"
            program.write_etdump_result_to_file(str(etdump), str(Path(scratch) / "debug.bin"))
            with warnings.catch_warnings():  # "Output Buffer not found": no tensor data was asked for
                warnings.simplefilter("ignore", UserWarning)
                inspector = Inspector(etdump_path=str(etdump))
    outside: Counter[str] = Counter()
    step, kind = 0.0, None
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for event in block.events:  # in execution order
            if event.perf_data is None:
                continue
            raw = list(event.perf_data.raw)[-runs:]  # milliseconds, one per run; the warm-up first
            seconds = sum(raw) / len(raw) / 1000.0
            if event.name == "Method::execute":
                step += seconds
            elif event.name.startswith("native_call_"):
                kind, kernel_seconds = op_kind(event.name), seconds
                outside[kind] += seconds
            elif event.name == "OPERATOR_CALL" and kind is not None:
                # the kernel's envelope (argument checks, dispatch) around the native call just before it
                outside[kind] += max(seconds - kernel_seconds, 0.0)
                kind = None
    if not math.isfinite(step) or step <= 0:
        raise ExecPlanError(
            f"the ETDump profile of {path}:{method} holds no Method::execute time; this runtime build records no "
            "profiling events, so the time outside the delegate is unknown"
        )
    return dict(outside), step
