"""What export and runtime share of a ``.pte``: the metadata method names, and importing ExecuTorch quietly.

A window's metadata is baked in as constant methods (``sample_rate()``, ``samples_per_frame()``,
``chunk_frames()``, ...), so a ``.pte`` describes itself without the manifest; in a program of several methods
each method's metadata is a constant method named ``{method}__{key}`` (:func:`metadata_method`), for a step
``{method}__step_contract()``, the step contract as JSON (:mod:`...graphs.step_contract`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

from ..interface import BackendUnavailableError

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


def require_executorch() -> None:
    try:
        with quiet_executorch_import():  # imported to probe the install; the writer imports what it uses itself
            import executorch.backends.xnnpack.partition.xnnpack_partitioner
            import executorch.exir  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--backend executorch needs the executorch package ({exc}); pip install executorch==1.5.1 "
            "(or `make setup`, whose .venv has it)"
        ) from exc
