"""Compile a stateful step graph (ONNX) to ``.rknn`` with rknn-toolkit2, and describe the result.

Runs where rknn-toolkit2 is installed: the converter venv (``make setup-rknn`` -> ``.venv-rknn``)::

    engine = build_engine("step_b16.onnx", "step_b16.rknn", target="rk3588", simulate=True)
    audio, cache = engine.run([codes, freqs, cache_valid, cache])   # PC simulator
    engine.release()
    report = report_engine("step_b16.rknn")

The fixed conversion shape: ``config(target) -> load_onnx -> build(fp16) -> export_rknn``
[``-> init_runtime()`` for the simulator], and the toolkit is always released on failure. The
toolkit's own output (which includes C-level lines such as ``REGTASK: The bit width of field
value exceeds the limit``) goes to ``<output>.build.log`` beside the artifact; a non-zero return
of any stage becomes :class:`RknnBuildError` naming the stage and that log.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgeError
from ..files import file_sha256, write_atomically

TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")
# rknn-toolkit2 2.5.0 fuses the rotate-half of RoPE (Slice, Slice, Concat) into a conv and then
# fails shape inference on the tensor it created (KeyError '<Transpose>_output_0_tp'): keep it off.
DISABLED_RULES = ("fuse_slice_slice_concat_to_conv",)
REGTASK_PATTERN = re.compile(r"REGTASK: The bit width of field value exceeds the limit")


class RknnBuildError(EdgeError):
    """A toolkit stage returned non-zero or raised; ``stage`` names it and ``log_path`` holds its output."""

    def __init__(self, stage: str, detail: str, log_path: Path | None):
        self.stage, self.log_path = stage, log_path
        where = f"; the toolkit's log is {log_path}" if log_path else ""
        super().__init__(f"rknn-toolkit2 {stage} failed: {detail}{where}")


def toolkit_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("rknn-toolkit2")
    except metadata.PackageNotFoundError:
        return "not installed"


def require_toolkit() -> Any:
    """The ``RKNN`` class, or :class:`RknnBuildError` saying how to make the converter venv."""
    try:
        from rknn.api import RKNN
    except ImportError as exc:
        raise RknnBuildError(
            "import",
            f"rknn-toolkit2 is not importable in {sys.executable} ({exc}). Make the converter venv with "
            "`make setup-rknn` and run this with .venv-rknn/bin/python",
            None,
        ) from exc
    return RKNN


@contextlib.contextmanager
def captured_output(log_path: Path) -> Iterator[None]:
    """Send this process's stdout/stderr (file descriptors 1 and 2, so C-level prints too) to ``log_path``."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def count_regtask_warnings(log_path: Path) -> int:
    with open(log_path, errors="replace") as log:
        return sum(1 for line in log if REGTASK_PATTERN.search(line))


@dataclass
class EngineReport:
    path: str
    target: str
    size_bytes: int
    sha256: str
    toolkit_version: str
    inputs: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    build_seconds: float | None = None
    regtask_warnings: int | None = None
    log_path: str | None = None
    shape_sets: list[list[list[int]]] | None = None  # dynamic_input: every input's shape, per set


def report_engine(
    rknn_path: str | os.PathLike[str],
    target: str = "",
    inputs: dict[str, list[int]] | None = None,
    outputs: dict[str, list[int]] | None = None,
) -> EngineReport:
    """Size, sha256 and I/O of a built ``.rknn`` (the I/O shapes come from the step contract it was built from)."""
    path = Path(rknn_path)
    if not path.is_file():
        raise RknnBuildError("report", f"no .rknn file at {path}", None)
    return EngineReport(
        path=str(path),
        target=target,
        size_bytes=path.stat().st_size,
        sha256=file_sha256(path),
        toolkit_version=toolkit_version(),
        inputs=dict(inputs or {}),
        outputs=dict(outputs or {}),
    )


class BuiltEngine:
    """A compiled step graph; with ``simulate=True`` it stays loaded in the PC simulator for :meth:`run`."""

    def __init__(self, rknn: Any, report: EngineReport, log_path: Path):
        self._rknn, self.report, self.log_path = rknn, report, log_path

    def run(self, inputs: list[Any]) -> list[Any]:
        if self._rknn is None:
            raise RknnBuildError("inference", "the engine was built without simulate=True or is released", None)
        with captured_output(self.log_path):
            outputs = self._rknn.inference(inputs=inputs)
        if outputs is None:
            raise RknnBuildError("inference", "the simulator returned no outputs", self.log_path)
        return outputs

    def accuracy_analysis(self, input_files: list[str], output_dir: Path) -> Path:
        """Per-layer error of the simulator against the float graph (``accuracy_analysis``); returns its dir."""
        with captured_output(self.log_path):
            code = self._rknn.accuracy_analysis(inputs=input_files, output_dir=str(output_dir))
        if code != 0:
            raise RknnBuildError("accuracy_analysis", f"returned {code}", self.log_path)
        return output_dir

    def release(self) -> None:
        if self._rknn is not None:
            self._rknn.release()
            self._rknn = None

    def __enter__(self) -> BuiltEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def build_engine(
    onnx_path: str | os.PathLike[str],
    rknn_path: str | os.PathLike[str],
    target: str = "rk3588",
    opt_level: int = 3,
    simulate: bool = False,
    inputs: dict[str, list[int]] | None = None,
    outputs: dict[str, list[int]] | None = None,
    shape_sets: list[list[list[int]]] | None = None,
) -> BuiltEngine:
    """config -> load_onnx -> build (fp16, no quantization) -> export_rknn [-> init_runtime for the simulator].

    INT8 is not offered: it measures 9.5-13 dB SNR on this decoder (DESIGN §4). The ``.rknn`` is
    written through a temporary name, so a failed build never leaves one that looks finished.

    ``shape_sets``: the toolkit's ``dynamic_input``, one list of every input's shape per set (the
    inputs in graph order). The ``.rknn`` then holds one copy of the weights and a compiled graph per
    set; inference (simulator, and rknnlite on a board) picks the set from the input arrays' shapes,
    and any other shape is refused.
    """
    if target not in TARGETS:
        raise RknnBuildError("config", f"unknown target {target!r}; known: {', '.join(TARGETS)}", None)
    RKNN = require_toolkit()
    onnx_path, rknn_path = Path(onnx_path), Path(rknn_path)
    log_path = rknn_path.with_name(rknn_path.name + ".build.log")
    log_path.write_text("")
    with captured_output(log_path):
        rknn = RKNN(verbose=False)
    started = time.perf_counter()
    try:
        with captured_output(log_path):
            _run_stage("config", lambda: rknn.config(
                target_platform=target, float_dtype="float16", optimization_level=opt_level,
                disable_rules=list(DISABLED_RULES), dynamic_input=shape_sets,
            ), log_path)  # fmt: skip
            _run_stage("load_onnx", lambda: rknn.load_onnx(model=str(onnx_path)), log_path)
            _run_stage("build", lambda: rknn.build(do_quantization=False), log_path)
            # The temporary keeps the .rknn suffix, which the toolkit insists on.
            write_atomically(
                rknn_path,
                lambda temporary: _run_stage("export_rknn", lambda: rknn.export_rknn(str(temporary)), log_path),
            )
        seconds = time.perf_counter() - started
        if simulate:
            with captured_output(log_path):
                _run_stage("init_runtime (simulator)", rknn.init_runtime, log_path)
    except BaseException:
        rknn.release()
        raise
    report = report_engine(rknn_path, target, inputs, outputs)
    report.build_seconds = round(seconds, 1)
    report.regtask_warnings = count_regtask_warnings(log_path)
    report.log_path = str(log_path)
    report.shape_sets = shape_sets
    if not simulate:
        rknn.release()
        rknn = None
    return BuiltEngine(rknn, report, log_path)


def _run_stage(stage: str, call: Any, log_path: Path) -> None:
    """Run one toolkit stage; an exception or a non-zero return becomes :class:`RknnBuildError`."""
    try:
        code = call()
    except RknnBuildError:
        raise
    except Exception as exc:  # the toolkit raises ValueError/KeyError/... from compiled code
        detail = str(exc).strip().splitlines()
        raise RknnBuildError(stage, f"{type(exc).__name__}: {detail[-1] if detail else ''}", log_path) from exc
    if code not in (0, None):
        raise RknnBuildError(stage, f"returned {code}", log_path)
