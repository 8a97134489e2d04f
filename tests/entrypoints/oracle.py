"""The official qwen-tts talker (``.venv-oracle``) run on a checkpoint: the oracle of the talker tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ORACLE_PYTHON = Path(".venv-oracle/bin/python")
ORACLE_SCRIPT = Path("tools/oracle/qwen_tts_talker_oracle.py")


def run_oracle(repo_root: Path, checkpoint: Path, work: Path, requests: list[dict]) -> list[dict]:
    """The official talker on ``requests`` (``tools/oracle/qwen_tts_talker_oracle.py``'s request objects): per
    request its frames (``codes``) and, for Base checkpoints, its speaker embedding and reference codes."""
    python, script = repo_root / ORACLE_PYTHON, repo_root / ORACLE_SCRIPT
    if not python.exists():
        pytest.fail(f"the oracle venv is missing ({python}); build it with `make setup-oracle`")
    (work / "requests.json").write_text(json.dumps(requests))
    command = [str(python), str(script), "generate", "--checkpoint", str(checkpoint)]
    command += ["--requests", str(work / "requests.json"), "--out", str(work / "oracle.json")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((work / "oracle.json").read_text())["requests"]
