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

import vllm_omni.entrypoints.edge_routes
from vllm_omni.entrypoints.edge_plans import load_served_plans
from vllm_omni.edge.runtime import open_decoder

plans = load_served_plans(["cpu_x86_64"], Path(sys.argv[1]))
assert plans.server_decoder.hardware_class == "cpu_x86_64"
open_decoder(plans.server_decoder, check_sha256=False).reset()
print("\\n".join(sorted(sys.modules)))
"""

NOT_IN_AN_API_SERVER = (
    "vllm_omni.edge.builders",
    "vllm_omni.edge.graphs.stateful",
    "vllm_omni.edge.graphs.windowed",
    "vllm_omni.edge.graphs.npu_layout",
    "vllm_omni.edge.backends.onnx",
    "vllm_omni.edge.backends.executorch",
    "vllm_omni.edge.backends.torch_export",
    "vllm_omni.edge.backends.rknn",
    "vllm_omni.edge.backends.window_programs",
    "vllm_omni.edge.checkpoint",
    "vllm_omni.entrypoints.cli",
    "onnx",
    "executorch",
    "rknn",
    "torch",
)


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
    assert "vllm_omni.entrypoints.edge_routes" in loaded and "vllm_omni.edge.backends.onnxruntime" in loaded
    found = [name for name in loaded if any(name == m or name.startswith(m + ".") for m in NOT_IN_AN_API_SERVER)]
    assert not found, f"an API server process imported {found}"
