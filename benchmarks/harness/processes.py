"""One process per runtime: a worker is this benchmark's module run again with ``--worker NAME``, in a fresh Python.

Thread pools of different runtimes fight on 2 cores, and a process's peak memory is its own only when nothing
else ran in it. A worker prints its result as JSON on the last line of its stdout (:func:`print_result`).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from .errors import BenchmarkError

REPO_ROOT = Path(__file__).resolve().parents[2]  # where the other venvs (.venv, .venv-oracle) and tools/ live


def run_worker(module: str, worker: str | None = None, *, python: str | Path | None = None, **options: Any) -> dict:
    """Run ``python -m module --worker WORKER --opt value ...`` and return the JSON of its last stdout line.

    ``options`` become flags (``audio_out`` -> ``--audio-out``): True a bare flag, None or False left out, a list
    or tuple one flag with several values, anything else ``str(value)``. ``python`` defaults to this interpreter
    (another venv's for a runtime this one lacks). The child inherits the working directory, so run benchmarks
    from the repository root (``python -m benchmarks.bench_NAME``).
    """
    command = [str(python or sys.executable), "-m", module]
    if worker is not None:
        command += ["--worker", worker]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            command.append(flag)
        elif isinstance(value, list | tuple):
            command += [flag, *map(str, value)]
        elif value is not None and value is not False:
            command += [flag, str(value)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise BenchmarkError(f"worker {' '.join(command[1:])} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def print_result(result: dict) -> int:
    """A worker's result on its own last stdout line (what :func:`run_worker` reads); returns 0."""
    print(json.dumps(result), flush=True)
    return 0


def _status_mb(field: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set, MB (VmHWM; ru_maxrss would carry the parent's over fork+exec)."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident set now, MB (VmRSS)."""
    return _status_mb("VmRSS") or 0.0
