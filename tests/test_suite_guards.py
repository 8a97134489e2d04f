"""The suite's own guards (tests/conftest.py): no pass goes green by skipping, and the vLLM pass without
vLLM fails at once in one line (each runs pytest on a probe in a fresh process, with this conftest loaded); no test
or benchmark edits ``sys.path`` (the code under test is imported as installed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PROBE = """
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip(REASON)
"""


def run_pytest(repo_root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, cwd=repo_root, timeout=300,
    )  # fmt: skip


def test_a_pass_with_an_undocumented_skip_fails_and_a_documented_one_does_not(repo_root, tmp_path):
    for reason, code in (("the venv is broken", 1), ("needs a CUDA device (GPU smoke test)", 0)):
        probe = tmp_path / f"test_probe_{code}.py"
        probe.write_text(PROBE.replace("REASON", repr(reason)))
        run = run_pytest(repo_root, "-p", "tests.conftest", "--rootdir", str(tmp_path), str(probe))
        assert run.returncode == code, run.stdout[-2000:]
        if code:
            assert "1 tests passed of 2 collected less 0 documented skips" in run.stdout


def test_selecting_the_vllm_tests_where_vllm_does_not_import_is_one_error_line(repo_root):
    import importlib.util

    assert importlib.util.find_spec("vllm") is None, "this check runs in the main venv, where vllm is not installed"
    run = run_pytest(repo_root, "-m", "vllm", "tests/model_executor/models/qwen3_tts/test_talker.py")
    errors = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("ERROR")]
    assert run.returncode == 4 and len(errors) == 1 and "make setup-vllm" in errors[0], run.stdout + run.stderr


SYS_PATH_EDITS = {"insert", "append", "extend", "remove", "clear"}


def sys_path_edits(source: str) -> list[int]:
    """The lines of ``source`` that change ``sys.path`` (a call of its list methods, an assignment to it or to an
    item of it, ``monkeypatch.syspath_prepend``)."""

    def is_sys_path(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys"

    lines = []
    for node in ast.walk(ast.parse(source)):
        method = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if method == "syspath_prepend" or (method in SYS_PATH_EDITS and is_sys_path(node.func.value)):
            lines.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                lines.append(node.lineno)
    return sorted(lines)


def test_no_test_or_benchmark_edits_sys_path(repo_root):
    probe = "import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path += ['z']\nmp.syspath_prepend('w')\n"
    assert sys_path_edits(probe) == [2, 3, 4, 5]
    edits = [
        f"{path.relative_to(repo_root)}:{line}"
        for folder in ("tests", "benchmarks")
        for path in sorted((repo_root / folder).rglob("*.py"))
        for line in sys_path_edits(path.read_text())
    ]
    assert not edits, f"these lines edit sys.path; import the installed package instead: {edits}"
