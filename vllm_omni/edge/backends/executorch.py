"""``.pte`` files: exported windows or stateful steps lowered to ExecuTorch, with a delegate partitioner.

``xnnpack`` (CPU, every phone) ships with the ``executorch`` package. ``coreml`` (Apple Neural
Engine) needs coremltools with Apple's CoreML framework (macOS); where that is missing this says
so and stops: it never falls back to another partitioner. Qualcomm's QNN is not offered: it needs
a compile spec per SoC, which this tool does not have yet, so it is not listed as a partitioner.
The window's metadata is baked in as constant methods (``sample_rate()``, ``samples_per_frame()``,
``chunk_frames()``, ...), so a ``.pte`` describes itself without the manifest.

One program may hold several methods (:meth:`ExecuTorchProgramWriter.write_methods`): a window per
method, or a stateful step per step size. They are lowered together, and XNNPACK keeps each weight
once in the program's named data (keyed by content), so the methods share one copy of the weights
(measured: a two-step program is 1.02x the size of one step). Each method's metadata is then a
constant method named ``{method}__{key}``: the window fields above, or for a step
``{method}__step_contract()``, the step contract as JSON (:mod:`..graphs.step_contract`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..files import write_atomically
from ..graphs.step_contract import StepContract, StepContractError
from ..graphs.window_contract import WindowContract
from ..plan.model import ExecPlan
from ..plan.schema import ExecPlanError
from .executorch_delegation import count_flops, delegation_report, op_kind
from .interface import BackendUnavailableError, LoadedWhileHeld, RunnerOptions
from .window_programs import WindowProgramBackend, check_program_metadata
from .xnnpack_options import share_packed_weights

PARTITIONERS = ("xnnpack", "coreml", "none")
# Importing executorch imports torchao, which logs "Failed to load ..." for each CUDA kernel library
# a CPU host cannot load, and makes torch's pytree log a deprecation about torchao's own enums.
# Neither is actionable; they are silenced around our imports of executorch, not globally.
NOISY_IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")
# The runtime's threadpool (cpuinfo) prints C-level lines such as "Failed to open midr file ..." on
# hosts whose /sys lacks what it probes; they say nothing about the program and are held back.
CPUINFO_NOISE = re.compile(r"cpuinfo|midr")
SINGLE_METHOD = "forward"
METADATA_SEPARATOR = "__"
STEP_CONTRACT_KEY = "step_contract"
MAX_STAGE_BYTES = 32 * 2**20  # the most weights one XNNPACK delegate owns (a load packs one stage at a time)


def metadata_method(method: str, key: str) -> str:
    """The constant method holding ``key`` of ``method``: bare for a single-method program's ``forward``."""
    return key if method == SINGLE_METHOD else f"{method}{METADATA_SEPARATOR}{key}"


@contextlib.contextmanager
def quiet_executorch_import() -> Iterator[None]:
    """Import executorch (and torchao) inside this block with their import-time log noise held back."""
    loggers = [logging.getLogger(name) for name in NOISY_IMPORT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def native_stderr_without(noise: re.Pattern[str]) -> Iterator[None]:
    """Hold back the lines matching ``noise`` that native code writes to stderr inside the block.

    File descriptor 2 goes to a temporary file for the block; afterwards every other line is
    written to stderr as it came, so real errors still show.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(True) if not noise.search(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def _require_executorch() -> None:
    try:
        with quiet_executorch_import():  # imported to probe the install; the writer imports what it uses itself
            import executorch.backends.xnnpack.partition.xnnpack_partitioner
            import executorch.exir  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--backend executorch needs the executorch package ({exc}); pip install executorch==1.5.1 "
            "(or `make setup`, whose .venv has it)"
        ) from exc


def _coreml_partitioner() -> Any:
    try:
        import coremltools.libcoremlpython  # noqa: F401  (the CoreML framework itself, absent off macOS)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--partitioner coreml needs coremltools with Apple's CoreML framework (macOS); this {sys.platform} host "
            f"has none ({exc}). Export on a Mac, or use --partitioner xnnpack"
        ) from exc
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    return CoreMLPartitioner()


def _xnnpack_partitioner(max_stage_bytes: int) -> Any:
    """XNNPACK's partitions, cut into stages of at most ``max_stage_bytes`` of weights (:mod:`.xnnpack_stages`)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from .xnnpack_stages import StagedPartitioner

    return StagedPartitioner(XnnpackPartitioner(), max_stage_bytes)


_PARTITIONER_FACTORIES = {
    "xnnpack": _xnnpack_partitioner,
    "coreml": lambda _max_stage_bytes: _coreml_partitioner(),
    "none": lambda _max_stage_bytes: None,
}


class ExecuTorchProgramWriter:
    name = "executorch"
    suffix = ".pte"

    def __init__(self, partitioner: str = "xnnpack", max_stage_bytes: int = MAX_STAGE_BYTES):
        """``max_stage_bytes``: the most weights one XNNPACK delegate owns (it packs them all at once when its
        method loads; :mod:`.xnnpack_stages`)."""
        if partitioner not in _PARTITIONER_FACTORIES:
            raise BackendUnavailableError(f"unknown partitioner {partitioner!r}; known: {', '.join(PARTITIONERS)}")
        _require_executorch()
        self.partitioner = partitioner
        self.max_stage_bytes = max_stage_bytes
        self._partitioner = _PARTITIONER_FACTORIES[partitioner](max_stage_bytes)  # fails now, before any export

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> dict[str, int]:
        """One program, ``forward``, with its metadata as bare constant methods."""
        return self.write_methods({SINGLE_METHOD: (exported, metadata)}, path)[SINGLE_METHOD]

    def write_methods(self, methods: dict[str, tuple[Any, dict[str, Any]]], path: Path) -> dict[str, dict[str, int]]:
        """Lower ``{method: (ExportedProgram, metadata)}`` together into one program at ``path``.

        The methods share the weights (stored once); each method's ``metadata`` becomes constant
        methods ``{method}__{key}`` (bare keys for a lone ``forward``). Returns op counts per method,
        with its :class:`~.executorch_delegation.DelegationReport` as JSON under ``delegation``.
        """
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import to_edge_transform_and_lower

        partitioners = [self._partitioner] if self._partitioner is not None else []
        constants = {
            metadata_method(method, key): value
            for method, (_, metadata) in methods.items()
            for key, value in metadata.items()
        }
        clashes = set(constants) & set(methods)
        if clashes:
            raise BackendUnavailableError(f"method names {sorted(clashes)} clash with metadata methods; rename them")
        exported = {method: program for method, (program, _) in methods.items()}
        flops = {method: count_flops(ep.module(), ep.example_inputs[0]) for method, ep in exported.items()}
        edge = to_edge_transform_and_lower(exported, partitioner=partitioners, constant_methods=constants)
        ops = {}
        for method in methods:
            lowered = edge.exported_program(method).graph_module
            info = get_delegation_info(lowered)
            report = delegation_report(method, self.partitioner, lowered, flops[method])
            ops[method] = {
                "delegated": int(info.num_delegated_nodes),
                "portable": int(info.num_non_delegated_nodes),
                "delegate_subgraphs": int(info.num_delegated_subgraphs),
                "delegation": report.to_json(),
            }
        program = edge.to_executorch()

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as handle:
                program.write_to_file(handle)

        write_atomically(path, write)
        return ops


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
