"""tools/run_test_passes.py: passes run side by side, each one's log kept, the failures shown, one total line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PASSING = "def test_one():\n    pass\n\ndef test_two():\n    pass\n"
FAILING = "def test_ok():\n    pass\n\ndef test_broken():\n    assert 1 == 2, 'the marker of the failure'\n"
SLEEPING = "import time\n\ndef test_sleeps():\n    time.sleep(60)\n"
THREADS = "import os\n\ndef test_threads():\n    assert os.environ['OMP_NUM_THREADS'] == os.environ['WANT_THREADS']\n"
THREADS += "    assert os.environ['VLLM_CPU_OMP_THREADS_BIND'] == 'nobind'\n"


def run_passes(
    repo_root: Path, tmp_path: Path, modules: dict[str, str], *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    passes = []
    for name, source in modules.items():
        module = tmp_path / f"test_{name}.py"
        module.write_text(source)
        passes.append(f"{name}={sys.executable} -m pytest -q -p no:cacheprovider --rootdir {tmp_path} {module}")
    command = [sys.executable, str(repo_root / "tools" / "run_test_passes.py"), "--logs", str(tmp_path / "logs")]
    return subprocess.run(
        [*command, *options, *passes], capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env
    )


def test_passes_run_at_once_and_a_failure_fails_the_run_with_its_log(repo_root, tmp_path):
    run = run_passes(repo_root, tmp_path, {"good": PASSING, "bad": FAILING, "fine": PASSING})
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "tests: 5 passed, 1 failed"
    assert "the marker of the failure" in run.stdout  # the failing pass's whole log
    assert "===== the log of bad" in run.stdout and "===== the log of good" not in run.stdout
    reports = {line.split(":")[0]: line for line in lines if line.startswith(("good:", "bad:", "fine:"))}
    assert "2 passed" in reports["good"] and "exit 0" in reports["good"]
    assert "1 failed, 1 passed" in reports["bad"] and "exit 1" in reports["bad"]
    assert sorted(path.name for path in (tmp_path / "logs").iterdir()) == ["bad.log", "fine.log", "good.log"]


def test_all_passing_exits_zero(repo_root, tmp_path):
    run = run_passes(repo_root, tmp_path, {"one": PASSING, "two": PASSING})
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "tests: 4 passed, 0 failed", run.stdout


def test_a_pass_over_its_time_is_killed_and_fails_the_run(repo_root, tmp_path):
    began = time.monotonic()
    # 12 s: time for the quick pass's pytest to start and end on a loaded 2-core machine (5 s was not, once)
    run = run_passes(repo_root, tmp_path, {"slow": SLEEPING, "quick": PASSING}, "--timeout-s", "12")
    assert time.monotonic() - began < 50, "the sleeping pass was not killed"
    assert run.returncode == 1 and "killed after 12 s" in run.stdout, run.stdout
    assert run.stdout.splitlines()[-1] == "tests: 2 passed, 1 failed"


def test_a_pass_not_written_name_equals_command_is_one_line(repo_root, tmp_path):
    command = [sys.executable, str(repo_root / "tools" / "run_test_passes.py"), "pytest -q"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert run.returncode != 0 and "expected NAME=COMMAND" in run.stderr and "Traceback" not in run.stderr


def test_a_pass_whose_program_is_missing_fails_in_its_log_and_the_others_run(repo_root, tmp_path):
    (tmp_path / "test_good.py").write_text(PASSING)
    good = f"good={sys.executable} -m pytest -q -p no:cacheprovider --rootdir {tmp_path} {tmp_path / 'test_good.py'}"
    command = [sys.executable, str(repo_root / "tools" / "run_test_passes.py"), "--logs", str(tmp_path / "logs")]
    run = subprocess.run([*command, "gone=.venv-none/bin/python -m pytest", good], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)  # fmt: skip
    assert run.returncode == 1 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "could not start .venv-none/bin/python" in run.stdout and "did not start" in run.stdout
    assert run.stdout.splitlines()[-1] == "tests: 2 passed, 1 failed"


def test_each_pass_gets_its_share_of_the_cores_as_unbound_openmp_threads(repo_root, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    for options, want in (((), share), (("--threads", "3"), 3)):
        env = {**os.environ, "WANT_THREADS": str(want)}
        run = run_passes(repo_root, tmp_path, {"one": THREADS, "two": THREADS}, "--lanes", "2", *options, env=env)
        assert run.returncode == 0, run.stdout
        assert f"{want} OpenMP thread(s) each" in run.stdout
    env = {**os.environ, "WANT_THREADS": "5", "OMP_NUM_THREADS": "5"}  # the environment's count is kept
    assert run_passes(repo_root, tmp_path, {"one": THREADS}, env=env).returncode == 0


def test_a_pass_runs_at_its_niceness_and_a_bad_one_is_one_line(repo_root, tmp_path):
    want = os.nice(0) + 7  # added to the runner's (this test may itself run in a pass at a niceness)
    nice = f"import os\n\ndef test_nice():\n    assert os.nice(0) == {want}, os.nice(0)\n"
    run = run_passes(repo_root, tmp_path, {"low": nice, "other": PASSING}, "--nice", "low=7")
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "tests: 3 passed, 0 failed", run.stdout
    for bad in ("nobody=5", "low=40", "low"):
        refused = run_passes(repo_root, tmp_path, {"low": PASSING}, "--nice", bad)
        assert refused.returncode != 0 and "--nice expects NAME=N" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
