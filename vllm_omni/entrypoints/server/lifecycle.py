"""How this API server process ends: a shutdown asked for (SIGTERM or SIGINT: the server drains), or an engine that
died unasked (the process must then exit non-zero, so that a supervisor restarts it).

vLLM's launcher owns the signals (its handler starts the engine's drain, ``--shutdown-timeout``, then stops the
HTTP server). :func:`watch` adds a Python-level handler beside it that only records the signal: the event loop's
own handler still runs, since CPython writes every handled signal to the loop's wake-up descriptor before any
Python-level handler is called. The same watch polls the engine client: an engine that errored while no shutdown was
asked for is recorded as a failure, which ``vllm serve --omni`` (:mod:`..cli.serve`) turns into exit code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm.omni.speech")

WATCH_INTERVAL_S = 0.5
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class Lifecycle:
    """The process's state: ``draining`` once a shutdown signal came; ``engine_failure`` (why) once the engine died
    with no shutdown asked for."""

    draining: bool = False
    engine_failure: str | None = None

    def drain(self, signum: int, _frame: Any = None) -> None:
        if not self.draining:
            logger.info("speech: %s: draining (new requests and sessions refused)", signal.Signals(signum).name)
        self.draining = True

    def check_engine(self, engine_client: Any) -> None:
        """Record an engine that errored unasked (once)."""
        if self.engine_failure is None and not self.draining and getattr(engine_client, "errored", False):
            self.engine_failure = "the engine core died (its log lines above say why); the server stops"
            logger.error("speech: %s", self.engine_failure)


LIFECYCLE = Lifecycle()  # this process's


def record_signals(lifecycle: Lifecycle = LIFECYCLE) -> None:
    """``lifecycle.drain`` as the Python-level handler of SIGTERM and SIGINT, where it is not already (vLLM's loop
    handlers keep running: see the module docstring). Only the main thread may set handlers: elsewhere, nothing."""
    for number in SHUTDOWN_SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread
            if signal.getsignal(number) != lifecycle.drain:
                signal.signal(number, lifecycle.drain)


async def watch(engine_client: Any, lifecycle: Lifecycle = LIFECYCLE) -> None:
    """For the life of the process: shutdown signals recorded (re-armed each turn: vLLM installs its loop handlers
    after the plugins start), and the engine's death noticed."""
    while True:
        record_signals(lifecycle)
        lifecycle.check_engine(engine_client)
        await asyncio.sleep(WATCH_INTERVAL_S)
