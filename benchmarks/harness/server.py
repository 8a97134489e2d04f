"""A loopback ``vllm serve CKPT --omni`` for the length of a benchmark, and what its ``/metrics`` say.

Run from the serving venv (``.venv-vllm``): the ``vllm`` command is the one beside this interpreter.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.testing.serve import ServerStartError, vllm_serve

from .errors import BenchmarkError


@dataclass(frozen=True)
class VllmServer:
    """A started server: its process (``vllm serve``, the API server's parent) and its base URL."""

    process: subprocess.Popen
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


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
    """The test kit's ``vllm serve`` (:func:`vllm_omni.testing.serve.vllm_serve`) with the benchmarks' engine
    arguments (``extra_args`` appended; a later flag wins), yielded once ``/health`` answers."""
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len)]
    args += ["--block-size", "32", "--kv-cache-memory-bytes", kv_cache]  # docs/serving/serve.md: CPU memory
    served = vllm_serve(
        checkpoint, hardware=hardware, artifacts=artifacts, log=log, args=[*args, *extra_args],
        start_timeout=start_timeout, stop_timeout=stop_timeout,
    )  # fmt: skip
    try:
        with served as (process, url):
            yield VllmServer(process, url)
    except ServerStartError as error:
        raise BenchmarkError(str(error)) from None


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
    while True:  # read at least once, however little of the limit is left
        if metric(url, "vllm:num_requests_running") == 0:
            return time.monotonic() - started
        if time.monotonic() - started >= limit_s:
            return None
        time.sleep(every_s)
