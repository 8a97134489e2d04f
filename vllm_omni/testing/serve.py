"""A loopback ``vllm serve CKPT --omni`` for a test or a benchmark: started on a free port, waited for, stopped.

The one launcher the serving tests (``tests/entrypoints/serving.py``) and the benchmarks (``benchmarks.harness``)
start servers with; each adds its own engine arguments. Run from the serving venv (``.venv-vllm``): the ``vllm``
command is the one beside this interpreter.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

HOST = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited, or did not answer ``/health``, before its start timeout; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(
    checkpoint: str | os.PathLike[str],
    *,
    hardware: str,
    artifacts: Path,
    log: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    start_timeout: float = 600,
    stop_timeout: float = 60,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``vllm serve checkpoint --omni --edge-hardware hardware --edge-artifacts artifacts`` on a free loopback port
    (``args`` appended, a later flag winning; ``env`` added to the environment; output to ``log``), yielded as its
    process and base URL once ``/health`` answers; terminated on exit, killed after ``stop_timeout`` seconds."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "vllm"), "serve", str(checkpoint), "--omni"]
    command += ["--edge-hardware", hardware, "--edge-artifacts", str(artifacts), "--host", HOST, "--port", str(port)]
    command += list(args)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://{HOST}:{port}"
    try:
        _wait_for_health(process, url, log, start_timeout)
        yield process, url
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)


def _wait_for_health(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise ServerStartError(f"the server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerStartError(f"the server did not answer /health in {timeout:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(2)
