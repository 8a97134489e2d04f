"""An API server process reads plans; building them is the start-up hand-off's job.

Checked in a fresh interpreter (the main venv: the routes import FastAPI and vLLM only inside their
functions): importing the routes, loading the served plans and opening the server's decoder load no
builder, graph wrapper or exporter. ``lint-imports`` holds the same rule statically.
"""

from __future__ import annotations

import subprocess
import sys

API_SERVER_PATH = """
import sys
from pathlib import Path

import vllm_omni.entrypoints.routes.edge_routes
from vllm_omni.entrypoints.plans.edge_plans import load_served_plans
from vllm_omni.edge.runtime import open_decoder

plans = load_served_plans(["cpu_x86_64"], Path(sys.argv[1]))
assert plans.server_decoder.hardware_class == "cpu_x86_64"
open_decoder(plans.server_decoder, check_sha256=False).reset()
print("\\n".join(sorted(sys.modules)))
"""

API_SERVER_CONTRACT = "An API server process reads plans only"


def not_in_an_api_server(repo_root) -> tuple[str, ...]:
    """The modules the import-linter contract forbids in the API modules (pyproject.toml), and torch and the
    CLI layer: an API process that reads plans and decodes PCM needs neither."""
    import tomllib

    contracts = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(API_SERVER_CONTRACT)]
    return (*contract["forbidden_modules"], "vllm_omni.entrypoints.cli", "torch")


def test_the_routes_and_plan_loading_import_no_builder_or_exporter(cpu_plan, repo_root):
    run = subprocess.run(
        [sys.executable, "-c", API_SERVER_PATH, str(cpu_plan.parent)],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = run.stdout.split()
    assert "vllm_omni.entrypoints.routes.edge_routes" in loaded and "vllm_omni.edge.backends.onnx.run" in loaded
    forbidden = not_in_an_api_server(repo_root)
    found = [name for name in loaded if any(name == m or name.startswith(m + ".") for m in forbidden)]
    assert not found, f"an API server process imported {found}"
