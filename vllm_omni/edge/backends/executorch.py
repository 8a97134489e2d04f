"""``.pte`` files: the exported window lowered to ExecuTorch, with a delegate partitioner.

``xnnpack`` (CPU, every phone) ships with the ``executorch`` package. ``coreml`` (Apple Neural
Engine) needs coremltools with Apple's CoreML framework (macOS); where that is missing this says
so and stops: it never falls back to another partitioner. Qualcomm's QNN is not offered: it needs
a compile spec per SoC, which this tool does not have yet, so it is not listed as a partitioner.
The window's metadata is baked in as constant methods (``sample_rate()``, ``samples_per_frame()``,
``chunk_frames()``, ...), so a ``.pte`` describes itself without the manifest.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..files import write_atomically
from ..graphs.window_contract import WindowContract
from .registry import BackendUnavailableError
from .window_programs import WindowProgramBackend, check_program_metadata

PARTITIONERS = ("xnnpack", "coreml", "none")
# Importing executorch imports torchao, which logs "Failed to load ..." for each CUDA kernel library
# a CPU host cannot load, and makes torch's pytree log a deprecation about torchao's own enums.
# Neither is actionable; they are silenced around our imports of executorch, not globally.
NOISY_IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")
# The runtime's threadpool (cpuinfo) prints C-level lines such as "Failed to open midr file ..." on
# hosts whose /sys lacks what it probes; they say nothing about the program and are held back.
CPUINFO_NOISE = re.compile(r"cpuinfo|midr")


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
        with quiet_executorch_import():
            importlib.import_module("executorch.exir")
            importlib.import_module("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--backend executorch needs the executorch package ({exc}); pip install executorch==1.5.1 "
            "(or `make setup`, whose .venv has it)"
        ) from exc


def _coreml_partitioner() -> Any:
    try:
        importlib.import_module("coremltools.libcoremlpython")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--partitioner coreml needs coremltools with Apple's CoreML framework (macOS); this {sys.platform} host "
            f"has none ({exc}). Export on a Mac, or use --partitioner xnnpack"
        ) from exc
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    return CoreMLPartitioner()


def _xnnpack_partitioner() -> Any:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


_PARTITIONER_FACTORIES = {
    "xnnpack": _xnnpack_partitioner,
    "coreml": _coreml_partitioner,
    "none": lambda: None,
}


class ExecuTorchProgramWriter:
    name = "executorch"
    suffix = ".pte"

    def __init__(self, partitioner: str = "xnnpack"):
        if partitioner not in _PARTITIONER_FACTORIES:
            raise BackendUnavailableError(f"unknown partitioner {partitioner!r}; known: {', '.join(PARTITIONERS)}")
        _require_executorch()
        self.partitioner = partitioner
        self._partitioner = _PARTITIONER_FACTORIES[partitioner]()  # fails now, before any export work

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> dict[str, int]:
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import to_edge_transform_and_lower

        partitioners = [self._partitioner] if self._partitioner is not None else []
        edge = to_edge_transform_and_lower(exported, partitioner=partitioners, constant_methods=dict(metadata))
        info = get_delegation_info(edge.exported_program().graph_module)
        program = edge.to_executorch()

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as handle:
                program.write_to_file(handle)

        write_atomically(path, write)
        return {
            "delegated": int(info.num_delegated_nodes),
            "portable": int(info.num_non_delegated_nodes),
            "delegate_subgraphs": int(info.num_delegated_subgraphs),
        }


def load_pte(path: str | os.PathLike[str]) -> tuple[Any, dict[str, int]]:
    """``(forward method, metadata)`` of a ``.pte`` in the ExecuTorch runtime (XNNPACK registered)."""
    with quiet_executorch_import(), native_stderr_without(CPUINFO_NOISE):
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(Path(path))
        metadata = {
            name: int(program.load_method(name).execute([])[0])
            for name in sorted(program.method_names)
            if name != "forward"
        }
        return program.load_method("forward"), metadata


class ExecuTorchWindowRunner:
    """A ``.pte`` window in the ExecuTorch runtime. Inputs and outputs cross as torch tensors (its API)."""

    def __init__(self, path: str | os.PathLike[str], contract: WindowContract):
        import torch

        self._torch = torch
        self.window = contract.window
        self.path = Path(path)
        self._method, metadata = load_pte(self.path)
        check_program_metadata(contract, metadata, self.path)

    def run(self, codes: np.ndarray) -> np.ndarray:
        (audio,) = self._method.execute([self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))])
        return audio.numpy().ravel()


# Windowed programs as ExecuTorch ``.pte`` files, lowered with a delegate partitioner.
BACKEND = WindowProgramBackend("executorch", "xnnpack", ExecuTorchProgramWriter, ExecuTorchWindowRunner)
