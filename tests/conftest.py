"""Shared fixtures: random-weight checkpoints in the released layout, written once per session.

Helpers shared by several test modules live here as fixtures or in :mod:`vllm_omni.testing`;
test modules never import each other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.testing.make_checkpoint import write_checkpoint

# -- which venv runs what, and no run that passes by skipping ------------------------------------------
#
# `make test` runs the suite in three passes: `-m "not vllm"` in .venv, `-m vllm` in .venv-vllm (split in two
# by module, run side by side: tools/run_test_passes.py). A module marked
# vllm as a whole (`pytestmark = pytest.mark.vllm`) imports vllm at its top, so where vllm does not
# import it is not collected at all; a run that selects the vllm tests there fails at once, in one line.
# Every skip must be a documented one: a run that passed fewer tests than it collected, less the
# documented skips, fails (a broken venv cannot turn a pass into skips).

VLLM_MODULE_MARK = "pytestmark = pytest.mark.vllm"
# Reasons a test may be skipped for, by the start of its reason, with where it runs instead.
DOCUMENTED_SKIPS = {
    "needs a CUDA device": "GPU-only checks; tools/gpu_check.py (make gpu-check) runs them where a GPU is lent",
    "this CPU has no bf16 in oneDNN": "the bf16 engine check; it runs on a host whose CPU has AVX-512 or AMX",
}


@pytest.fixture(scope="session")
def gpu_check():
    """``tools/gpu_check.py`` as a module (a script, not a package): its random-weight code predictors and checks."""
    spec = importlib.util.spec_from_file_location(
        "gpu_check", Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _selects_vllm_tests(config: pytest.Config) -> bool:
    markexpr = (config.getoption("markexpr") or "").replace(" ", "")
    return "vllm" in markexpr and "notvllm" not in markexpr


def pytest_configure(config: pytest.Config) -> None:
    if _selects_vllm_tests(config) and not _vllm_importable():
        raise pytest.UsageError(
            f"the vLLM tests were selected (-m {config.getoption('markexpr')!r}) but vllm does not import in "
            f"{sys.prefix}: run `make setup-vllm` (delete {sys.prefix}/.stamp first to rebuild it)"
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") and not _vllm_importable():
        return VLLM_MODULE_MARK in collection_path.read_text(encoding="utf-8") or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _vllm_importable():
        return
    vllm_items = [item for item in items if item.get_closest_marker("vllm") is not None]
    if vllm_items:
        config.hook.pytest_deselected(items=vllm_items)
        items[:] = [item for item in items if item.get_closest_marker("vllm") is None]


_PASSED: set[str] = set()
_SKIPPED: dict[str, str] = {}  # node id -> reason


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED[report.nodeid] = reason.removeprefix("Skipped: ")
    elif report.when == "call" and report.passed:
        _PASSED.add(report.nodeid)


def _shortfall(session: pytest.Session) -> str | None:
    """Why this run passed fewer tests than it collected less the documented skips, or None."""
    documented = {node for node, reason in _SKIPPED.items() if reason.startswith(tuple(DOCUMENTED_SKIPS))}
    expected = session.testscollected - len(documented)
    if len(_PASSED) >= expected:
        return None
    undocumented = [(node, reason) for node, reason in _SKIPPED.items() if node not in documented]
    first = f"; first skip: {undocumented[0][0]}: {undocumented[0][1]}" if undocumented else ""
    return (
        f"{len(_PASSED)} tests passed of {session.testscollected} collected less {len(documented)} documented skips "
        f"({expected}){first}: a run must not go green by skipping (tests/conftest.py DOCUMENTED_SKIPS)"
    )


_FAILURES: list[str] = []  # the shortfall of this run, once it finished (the summary prints it)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ran = exitstatus == pytest.ExitCode.OK and not session.config.option.collectonly
    shortfall = _shortfall(session) if ran else None
    if shortfall:
        _FAILURES.append(shortfall)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    for failure in _FAILURES:  # after pytest_sessionfinish: the terminal reporter summarises after it
        terminalreporter.write_line(f"FAILED: {failure}", red=True)


@contextlib.contextmanager
def environment_variable(name: str, value: str):
    """``name=value`` in this process's environment (and so in the subprocesses it starts) for the ``with`` block;
    what was there before is put back after, or the variable removed."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@pytest.fixture(scope="session", autouse=True)
def device_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-device state (verified files, optimized onnxruntime graphs) goes to a temporary directory, not ~/.cache.

    Subprocesses the tests start inherit it through the environment.
    """
    from vllm_omni.edge.integrity import CACHE_ENV

    directory = tmp_path_factory.mktemp("device-cache")
    with environment_variable(CACHE_ENV, str(directory)):
        yield directory


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", "small", seed=0)


@pytest.fixture(scope="session")
def talker_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole model directory: a tiny random-weight talker and BPE tokenizer over a small-geometry decoder.

    The decoder is the ``moderate`` drive one (:mod:`vllm_omni.testing.drive`, seed 1): the Rockchip
    tests compile it (its fp16 ceiling makes their bar meaningful), and the serving tests serve the plan
    they compiled (:func:`shared_plans`) instead of compiling it again.
    """
    from vllm_omni.testing.drive import write_drive_checkpoint

    return write_drive_checkpoint(tmp_path_factory.mktemp("ckpt") / "talker", "small", "moderate", 1, talker="tiny")


class SharedPlans:
    """Plans one pytest run built, kept for the others (the later servers of a pass serve the CPU plan its first
    built; a server serves the Rockchip plan the main pass compiled when an earlier pass left one), keyed by the
    checkpoint's sha256 and the hardware class, under ``out/test-plans/`` (ignored by git).

    ``make test``'s passes run side by side (tools/run_test_passes.py): a plan is published whole (copied beside
    its slot, then renamed into it), and a plan not there yet, or replaced while it is copied, is not copied (the
    server builds its own).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _slot(self, checkpoint: Path, hardware: str) -> Path:
        import hashlib

        from vllm_omni.edge.checkpoint import checkpoint_sha256, resolve_speech_tokenizer
        from vllm_omni.edge.hardware.registry import hardware_classes

        # the class's record and the graphs' code too: a plan kept from before either changed is not reused
        graphs = sorted((Path(__file__).parents[1] / "vllm_omni" / "edge" / "graphs").glob("*.py"))
        source = repr(hardware_classes().get(hardware)).encode() + b"".join(path.read_bytes() for path in graphs)
        record = hashlib.sha256(source).hexdigest()[:8]
        return self.root / checkpoint_sha256(resolve_speech_tokenizer(checkpoint))[:16] / f"{hardware}-{record}"

    def publish(self, checkpoint: Path, hardware: str, plan_dir: Path) -> None:
        import shutil
        import tempfile

        slot = self._slot(checkpoint, hardware)
        slot.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{hardware}-", dir=slot.parent))
        shutil.copytree(plan_dir, staged, dirs_exist_ok=True)
        shutil.rmtree(slot, ignore_errors=True)
        try:
            os.rename(staged, slot)
        except OSError:  # another pass published the same plan first
            shutil.rmtree(staged, ignore_errors=True)

    def copy_to(self, checkpoint: Path, hardware: str, target: Path) -> bool:
        """Copy the kept plan of ``hardware`` for ``checkpoint`` to ``target`` if one validates; False otherwise."""
        import shutil

        from vllm_omni.edge.errors import EdgeError
        from vllm_omni.edge.plan.model import ExecPlan

        slot = self._slot(checkpoint, hardware)
        try:
            ExecPlan.load(slot)
            shutil.copytree(slot, target)
        except (EdgeError, OSError):
            shutil.rmtree(target, ignore_errors=True)
            return False
        return True


@pytest.fixture(scope="session")
def shared_plans(repo_root: Path) -> SharedPlans:
    return SharedPlans(repo_root / "out" / "test-plans")


@pytest.fixture(scope="session")
def small_decoder(small_checkpoint: Path):
    return load_code2wav_decoder(small_checkpoint)


# Stateful CPU classes at the small geometry: first step B=2, main step B=4 (a few seconds).
STEP_ARGS = ("--step-frames", "4", "--first-step-frames", "2")


def _build_plan(checkpoint: Path, out_dir: Path, hardware: str, *args: str) -> Path:
    from vllm_omni.edge.cli.main import main as edge_main

    command = ["build", "--hardware", hardware, "--model", str(checkpoint), "--out", str(out_dir), *args]
    assert edge_main(command) == 0
    return out_dir


@pytest.fixture(scope="session")
def build_plan():
    """``build_plan(checkpoint, out_dir, hardware, *args)``: ``python -m vllm_omni.edge build``, which must succeed."""
    return _build_plan


@pytest.fixture(scope="session")
def cpu_plan(small_checkpoint, tmp_path_factory) -> Path:
    return _build_plan(small_checkpoint, tmp_path_factory.mktemp("plans") / "cpu_x86_64", "cpu_x86_64", *STEP_ARGS)


class BackgroundRuns:
    """Commands run in the background, ``lanes`` at a time in the order they were added, each waited for by the
    fixture or test that needs it.

    On a 2-core machine a build or a process start-up that keeps one core busy (ExecuTorch's lowering, the RKNN
    compile, a vLLM engine's start) leaves the other idle; one beside it halves the wait. ``add`` queues a command
    (a name, the command, its working directory), ``start`` starts the lanes, ``result`` waits for one and returns its
    completed process (``returncode``, ``stdout``, ``stderr``) or ``None`` when it was never queued, ``close`` kills
    what still runs.
    """

    def __init__(self, lanes: int = 1, timeout_s: float = 1800) -> None:
        self.lanes, self.timeout_s = lanes, timeout_s
        self._queue: list[tuple[str, list[str], Path]] = []
        self._done: dict[str, threading.Event] = {}
        self._results: dict[str, subprocess.CompletedProcess] = {}
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    def add(self, name: str, command: list[str], cwd: Path) -> None:
        self._queue.append((name, [str(part) for part in command], cwd))
        self._done[name] = threading.Event()

    def start(self) -> None:
        pending = list(reversed(self._queue))
        for lane in range(min(self.lanes, len(pending))):
            thread = threading.Thread(target=self._lane, args=(pending,), name=f"background-run-{lane}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _lane(self, pending: list[tuple[str, list[str], Path]]) -> None:
        while True:
            with self._lock:
                if not pending:
                    return
                name, command, cwd = pending.pop()
            try:
                self._results[name] = self._run(command, cwd)
            except Exception as exc:  # any failure is the waiting test's to report
                self._results[name] = subprocess.CompletedProcess(command, -1, "", f"{type(exc).__name__}: {exc}")
            finally:
                self._done[name].set()

    def _run(self, command: list[str], cwd: Path) -> subprocess.CompletedProcess:
        if self._closing.is_set():
            raise RuntimeError("the session ended before this run started")
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with self._lock:
            self._running.add(process)
        try:
            stdout, stderr = process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            stderr += f"\n[background run] killed after {self.timeout_s:g} s"
        finally:
            with self._lock:
                self._running.discard(process)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def result(self, name: str) -> subprocess.CompletedProcess | None:
        if name not in self._done:
            return None
        self._done[name].wait()
        return self._results[name]

    def close(self) -> None:
        """Stop what is still queued or running (a session that ends early: -x, an interrupt)."""
        self._closing.set()
        with self._lock:
            for process in self._running:
                process.kill()
        for thread in self._threads:
            thread.join(timeout=60)


def first_use(items: list[pytest.Item]) -> dict[str, int]:
    """Each fixture and test name of a run -> the place of the first selected test that uses it."""
    places: dict[str, int] = {}
    for index, item in enumerate(items):
        for name in (getattr(item, "originalname", item.name), *item.fixturenames):
            places.setdefault(name, index)
    return places


@pytest.fixture(scope="session")
def background_runs():
    """``background_runs(lanes=1, timeout_s=1800)``: a new :class:`BackgroundRuns`, closed at the end of the session."""
    made: list[BackgroundRuns] = []

    def make(lanes: int = 1, timeout_s: float = 1800) -> BackgroundRuns:
        made.append(BackgroundRuns(lanes, timeout_s))
        return made[-1]

    yield make
    for runs in made:
        runs.close()
