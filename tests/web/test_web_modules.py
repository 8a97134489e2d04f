"""The browser class's JavaScript modules (web/edge/) pass their Node tests against fixtures made here by the
Python implementation: the wire protocol parser (golden and hostile streams), the stateful decoder in
onnxruntime-web (>= 100 dB against the Python full decode) and the plan loader (sha256 checks)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.web.make_fixtures import write_fixtures

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "web"


def node_and_packages() -> str:
    """Node, with web/'s packages installed (``make test`` runs ``make setup-web`` first: never a skip)."""
    node = shutil.which("node")
    assert node is not None, "node is not on PATH: install Node.js 20 (the machine image has it)"
    assert (WEB / "node_modules" / "onnxruntime-web" / "package.json").is_file(), (
        "web/node_modules/onnxruntime-web is missing: run `make setup-web`"
    )
    return node


def test_the_javascript_edge_modules_pass_their_node_tests_against_python_fixtures(tmp_path, small_checkpoint):
    node = node_and_packages()
    fixtures = write_fixtures(tmp_path / "fixtures", checkpoint=small_checkpoint)
    run = subprocess.run(
        [node, "--test", "web/edge/test/"],
        cwd=REPO,
        env={**os.environ, "EDGE_WEB_FIXTURES": str(fixtures)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20000:]
    assert "# fail 0" in output and "vs full decode" in output, output[-5000:]
