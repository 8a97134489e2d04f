"""A loopback ``vllm serve CKPT --omni`` for the length of a benchmark, and what its ``/metrics`` say.

Run from the serving venv (``.venv-vllm``): the ``vllm`` command is the one beside this interpreter.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import BenchmarkError


@dataclass(frozen=True)
class VllmServer:
    """A started server: its process (``vllm serve``, the API server's parent) and its base URL."""

    process: subprocess.Popen
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_server(
    checkpoint: Path,
    artifacts: Path,
    log: Path,
    extra_args: Sequence[str] = (),
    *,
    hardware: str = "cpu_x86_64",
    max_model_len: int = 1024,
    kv_cache: str = "256M",
    start_timeout: float = 900,
    stop_timeout: float = 120,
) -> Iterator[VllmServer]:
    """``vllm serve`` on a free loopback port (``extra_args`` appended; a later flag wins), yielded once
    ``/health`` answers; its output goes to ``log``. On exit it is terminated, and killed after
    ``stop_timeout`` seconds."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "vllm"), "serve", str(checkpoint), "--omni"]
    command += ["--edge-hardware", hardware, "--edge-artifacts", str(artifacts), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len)]
    command += ["--block-size", "32", "--kv-cache-memory-bytes", kv_cache]  # docs/serving/serve.md: CPU memory
    command += list(extra_args)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        server = VllmServer(process, f"http://127.0.0.1:{port}")
        _wait_for_health(server, log, start_timeout)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)


def _wait_for_health(server: VllmServer, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchmarkError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise BenchmarkError(f"the server did not start in {timeout:.0f} s; see {log}")


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on ``/metrics`` whose labels include ``labels``."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        sample = line.startswith(name + "{") or line.startswith(name + " ")
        if sample and all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def drain(url: str, limit_s: float = 60.0, every_s: float = 0.2) -> float | None:
    """Wait until the engine runs no request (``vllm:num_requests_running`` is 0), at most ``limit_s``: the
    seconds it took, None if requests still ran at the limit."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if metric(url, "vllm:num_requests_running") == 0:
            return time.monotonic() - started
        time.sleep(every_s)
    return None
