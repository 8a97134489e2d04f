"""Compile a stateful step graph (ONNX) to ``.rknn`` with rknn-toolkit2, and describe the result.

Runs where rknn-toolkit2 is installed: the converter venv (``make setup-rknn`` -> ``.venv-rknn``)::

    engine = build_engine("step_b16.onnx", "step_b16.rknn", target="rk3588", simulate=True)
    audio, cache = engine.run([codes, freqs, cache_valid, cache])   # PC simulator
    engine.release()
    report = report_engine("step_b16.rknn")

The fixed conversion shape: ``config(target) -> load_onnx -> build(fp16) -> export_rknn``
[``-> init_runtime()`` for the simulator], and the toolkit is always released on failure. The
toolkit runs verbose in a scratch working directory (its ``check*.onnx`` stage dumps never land
in the caller's), and its own output goes to ``<output>.build.log`` beside the artifact,
C-level lines included (``REGTASK: The bit width of field value exceeds the limit``; librknnc's
``No lowering found for: ...`` comes through C stdio, which is flushed into the log after each
stage instead of at process exit). A non-zero return of any stage becomes
:class:`RknnBuildError` naming the stage and that log.

The report (:class:`EngineReport`) counts the REGTASK lines and reads the op placement from the
log (:func:`parse_placement`): the verbose build prints a "Network Layer Information Table" per
compiled graph whose ``Target`` column says where each op runs (``NPU`` or ``CPU``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...files import file_sha256, write_atomically
from .errors import RknnBuildError

TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")
# rknn-toolkit2 2.5.0 fuses the rotate-half of RoPE (Slice, Slice, Concat) into a conv and then
# fails shape inference on the tensor it created (KeyError '<Transpose>_output_0_tp'): keep it off.
DISABLED_RULES = ("fuse_slice_slice_concat_to_conv",)
REGTASK_PATTERN = re.compile(r"REGTASK: The bit width of field value exceeds the limit")
# librknnc, for an op the NPU compiler has no kernel for: the op stays on the CPU, and boards have
# aborted on such an Einsum at run time ("unsupport Einsum op in current", rknn-toolkit2 issues 366, 387).
NO_LOWERING_PATTERN = re.compile(r"No lowering found for: (?P<node>\S+), node type = (?P<op>[^,\s]+)")
LAYER_TABLE_TITLE = "Network Layer Information Table"
# A row of that table after the log prefix: ID, OpType, DataType, Target, ..., FullName ("OpType:node").
LAYER_ROW_PATTERN = re.compile(r"^(?:[DIWE] RKNN: \[[^\]]*\] )?\s*\d+\s+(?P<op>\S+)\s+\S+\s+(?P<target>NPU|CPU)\s")
# The graph's inputs and outputs are placed on the CPU in every build: not ops of the graph.
IO_OPERATORS = ("InputOperator", "OutputOperator")
# What a clean build of the NPU step graph (graphs/npu_layout.py, rknn-toolkit2 2.5.0) places on the
# CPU, and why. Anything else, or any op without a lowering, fails the conversion unless allowed.
EXPECTED_CPU_OPS = {
    "Gather": "codebook lookup indexed by the int64 codes (the NPU gathers no int64 indices)",
    "Split": "the int64 codes split per codebook",
    "Reshape": "a view of an input, an output or a cache region (no arithmetic)",
    "Sub": "the unwritten-slot bias from the cache_valid input",
}
# rk3588 and the older NPUs have no Sin/Cos (RoPE's angles, SnakeBeta); rk3576's runs them.
TRIGONOMETRY_ON_CPU = {
    "Sin": "this NPU has no Sin (RoPE, SnakeBeta)",
    "Cos": "this NPU has no Cos (RoPE)",
}
TRIGONOMETRY_ON_NPU_TARGETS = ("rk3576",)


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


def flush_c_stdio() -> None:
    """``fflush(NULL)``: write out what C code buffered on its ``stdout`` (a file's buffer, not a line's)."""
    with contextlib.suppress(OSError, AttributeError):  # no C library to ask: nothing can have buffered there
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def captured_output(log_path: Path, workdir: Path | None = None) -> Iterator[None]:
    """Send this process's stdout/stderr (file descriptors 1 and 2, so C-level prints too) to ``log_path``.

    C stdio buffered while the descriptors pointed at the log is flushed before they are restored, so
    nothing the toolkit printed reaches the terminal at exit. ``workdir``: run in that directory meanwhile.
    """
    sys.stdout.flush(), sys.stderr.flush()
    flush_c_stdio()
    saved = os.dup(1), os.dup(2)
    cwd = os.getcwd()
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            if workdir is not None:
                os.chdir(workdir)
            yield
        finally:
            os.chdir(cwd)
            sys.stdout.flush(), sys.stderr.flush()
            flush_c_stdio()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def count_regtask_warnings(log_path: Path) -> int:
    with open(log_path, errors="replace") as log:
        return sum(1 for line in log if REGTASK_PATTERN.search(line))


def expected_cpu_ops(target: str) -> dict[str, str]:
    """The op kinds a clean build for ``target`` places on the CPU, each with its reason."""
    if target in TRIGONOMETRY_ON_NPU_TARGETS:
        return dict(EXPECTED_CPU_OPS)
    return EXPECTED_CPU_OPS | TRIGONOMETRY_ON_CPU


@dataclass
class Placement:
    """Where the toolkit placed a build's ops, read from its verbose log.

    ``cpu_ops``: per op kind on the CPU, ``{"count", "nodes", "reason"}`` (nodes by name, each once
    over every compiled graph: ``dynamic_input`` compiles one per shape set); ``no_lowering``: each
    ``{"node", "op"}`` librknnc found no lowering for; ``graphs`` / ``npu_ops`` / ``cpu_op_count``:
    per compiled graph, the number of tables read and the ops on each side (inputs and outputs aside).
    """

    graphs: int = 0
    npu_ops: list[int] = field(default_factory=list)
    cpu_op_count: list[int] = field(default_factory=list)
    cpu_ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    no_lowering: list[dict[str, str]] = field(default_factory=list)

    def unexpected(self, target: str) -> dict[str, dict[str, Any]]:
        """The CPU op kinds :func:`expected_cpu_ops` does not name, and every op without a lowering."""
        expected = expected_cpu_ops(target)
        found = {op: entry for op, entry in self.cpu_ops.items() if op not in expected}
        for missing in self.no_lowering:
            entry = found.setdefault(f"{missing['op']} (no lowering)", {"count": 0, "nodes": [], "reason": ""})
            entry["count"] += 1
            entry["nodes"].append(missing["node"])
            entry["reason"] = "librknnc found no lowering (use CustomOperatorLower): a board may abort on it"
        return found

    def describe(self) -> str:
        kinds = ", ".join(f"{op} x{entry['count']}" for op, entry in sorted(self.cpu_ops.items())) or "none"
        lowering = f"; {len(self.no_lowering)} without a lowering" if self.no_lowering else ""
        return f"on the CPU: {kinds}{lowering}"


def parse_placement(log_text: str, target: str = "") -> Placement:
    """The op placement of the verbose build log ``log_text`` (``target`` gives the expected ops' reasons)."""
    placement, nodes = Placement(), {}
    in_table = False
    for line in log_text.splitlines():
        if LAYER_TABLE_TITLE in line:
            in_table = True
            placement.graphs += 1
            placement.npu_ops.append(0), placement.cpu_op_count.append(0)
            continue
        if in_table and ("Information Table" in line or "<<<<<<<< end:" in line):  # the table's pass ended
            in_table = False
        missing = NO_LOWERING_PATTERN.search(line)
        if missing:
            entry = {"node": missing["node"], "op": missing["op"]}
            if entry not in placement.no_lowering:
                placement.no_lowering.append(entry)
            continue
        row = LAYER_ROW_PATTERN.match(line) if in_table else None
        if row is None or row["op"] in IO_OPERATORS:
            continue
        if row["target"] == "NPU":
            placement.npu_ops[-1] += 1
            continue
        placement.cpu_op_count[-1] += 1
        name = line.split()[-1]
        name = name.split(":", 1)[1] if name.startswith(f"{row['op']}:") else name
        nodes.setdefault(row["op"], {}).setdefault(name, None)
    reasons = expected_cpu_ops(target)
    for op, names in sorted(nodes.items()):
        reason = reasons.get(op, f"not in EXPECTED_CPU_OPS for {target or 'this target'}")
        placement.cpu_ops[op] = {"count": len(names), "nodes": list(names), "reason": reason}
    return placement


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
    placement: dict[str, Any] | None = None  # vars(Placement): ops on the CPU, ops without a lowering


def report_engine(
    rknn_path: str | os.PathLike[str],
    target: str = "",
    inputs: dict[str, list[int]] | None = None,
    outputs: dict[str, list[int]] | None = None,
    log_path: str | os.PathLike[str] | None = None,
) -> EngineReport:
    """Size, sha256 and I/O of a built ``.rknn`` (the I/O shapes come from the step contract it was built from).

    With ``log_path`` (its verbose build log) also the REGTASK count and the op placement.
    """
    path = Path(rknn_path)
    if not path.is_file():
        raise RknnBuildError("report", f"no .rknn file at {path}", None)
    report = EngineReport(
        path=str(path),
        target=target,
        size_bytes=path.stat().st_size,
        sha256=file_sha256(path),
        toolkit_version=toolkit_version(),
        inputs=dict(inputs or {}),
        outputs=dict(outputs or {}),
    )
    if log_path is not None:
        log = Path(log_path)
        report.log_path = str(log)
        report.regtask_warnings = count_regtask_warnings(log)
        placement = parse_placement(log.read_text(errors="replace"), target)
        if not placement.graphs:  # a log without the table: the build did not run verbose
            raise RknnBuildError("report", "the build log holds no op placement table (verbose build?)", log)
        report.placement = vars(placement)
    return report


class BuiltEngine:
    """A compiled step graph; with ``simulate=True`` it stays loaded in the PC simulator for :meth:`run`."""

    def __init__(
        self, rknn: Any, report: EngineReport | None, log_path: Path, workdir: tempfile.TemporaryDirectory | None
    ):
        self._rknn, self.report, self.log_path, self._workdir = rknn, report, log_path, workdir

    def toolkit_call(self) -> contextlib.AbstractContextManager[None]:
        """Around each toolkit call: its output to the log, its working directory the scratch one."""
        return captured_output(self.log_path, Path(self._workdir.name) if self._workdir else None)

    def run(self, inputs: list[Any]) -> list[Any]:
        if self._rknn is None:
            raise RknnBuildError("inference", "the engine was built without simulate=True or is released", None)
        with self.toolkit_call():
            outputs = self._rknn.inference(inputs=inputs)
        if outputs is None:
            raise RknnBuildError("inference", "the simulator returned no outputs", self.log_path)
        return outputs

    def accuracy_analysis(self, input_files: list[str], output_dir: Path) -> Path:
        """Per-layer error of the simulator against the float graph (``accuracy_analysis``); returns its dir."""
        with self.toolkit_call():
            code = self._rknn.accuracy_analysis(
                inputs=[str(Path(path).resolve()) for path in input_files], output_dir=str(output_dir.resolve())
            )
        if code != 0:
            raise RknnBuildError("accuracy_analysis", f"returned {code}", self.log_path)
        return output_dir

    def release(self) -> None:
        if self._rknn is not None:
            with self.toolkit_call():
                self._rknn.release()
            self._rknn = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

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

    INT8 is not offered: it measured 9.5-13 dB SNR on this decoder (audible noise; fp16 is above 50 dB). The
    ``.rknn`` is written through a temporary name, so a failed build never leaves one that looks finished. The
    toolkit runs verbose (the op placement table) in a scratch directory that :meth:`BuiltEngine.release`
    removes; the report carries the REGTASK count and the placement.

    ``shape_sets``: the toolkit's ``dynamic_input``, one list of every input's shape per set (the
    inputs in graph order). The ``.rknn`` then holds one copy of the weights and a compiled graph per
    set; inference (simulator, and rknnlite on a board) picks the set from the input arrays' shapes,
    and any other shape is refused.
    """
    if target not in TARGETS:
        raise RknnBuildError("config", f"unknown target {target!r}; known: {', '.join(TARGETS)}", None)
    RKNN = require_toolkit()
    # Absolute: the toolkit runs in a scratch directory (its check*.onnx stage dumps go there).
    onnx_path, rknn_path = Path(onnx_path).resolve(), Path(rknn_path).resolve()
    log_path = rknn_path.with_name(rknn_path.name + ".build.log")
    log_path.write_text("")
    workdir = tempfile.TemporaryDirectory(prefix="rknn-build-")
    engine = BuiltEngine(None, None, log_path, workdir)  # released on any failure: the toolkit, then the scratch
    try:
        with engine.toolkit_call():
            rknn = engine._rknn = RKNN(verbose=True)
        started = time.perf_counter()
        with engine.toolkit_call():
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
            with engine.toolkit_call():
                _run_stage("init_runtime (simulator)", rknn.init_runtime, log_path)
        engine.report = report_engine(rknn_path, target, inputs, outputs, log_path=log_path)
    except BaseException:
        engine.release()
        raise
    engine.report.build_seconds = round(seconds, 1)
    engine.report.shape_sets = shape_sets
    if not simulate:
        engine.release()
    return engine


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
