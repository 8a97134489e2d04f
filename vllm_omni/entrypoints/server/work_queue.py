"""CPU work of the speech routes on a thread pool whose waiting and running jobs are bounded.

A job beyond the bound is refused at once (503 with ``Retry-After``) instead of waiting behind work that may take
minutes, and a job whose caller is cancelled before it starts (its client left: the route or session awaiting it
is cancelled) is dropped from the pool's queue, never run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vllm_omni.errors import RequestRefused

T = TypeVar("T")
RETRY_AFTER_S = 1


class WorkQueue:
    """``threads`` threads for one kind of work (``what``: named in refusals), at most ``limit`` jobs queued or
    running; cancelling an awaiting caller cancels its job unless it already runs. ``jobs`` counts work, not
    callers: a job whose caller was cancelled while it ran counts until it has finished."""

    def __init__(self, what: str, threads: int, limit: int) -> None:
        self.what, self.limit = what, limit
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=f"speech-{what.replace(' ', '-')}")
        self.jobs = 0

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the pool; raises a 503 :class:`~vllm_omni.errors.RequestRefused` when it is full."""
        if self.jobs >= self.limit:
            raise RequestRefused(
                f"{self.jobs} {self.what} jobs are waiting or running, the most this server takes "
                f"(--speech-max-queued-jobs): try again in a moment",
                status=503,
                retry_after_s=RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        job = self.pool.submit(work, *args)
        self.jobs += 1
        # The count drops when the job is over (done, failed, or cancelled before it started), on the loop's thread.
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._finished))
        # Cancelling the caller cancels the pool's future: a job that has not started is never run.
        return await asyncio.wrap_future(job)

    def _finished(self) -> None:
        self.jobs -= 1
