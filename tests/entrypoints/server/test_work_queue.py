"""Bounded server work: a full queue refuses at once with Retry-After, a job whose caller left never runs, and the
sessions and responses one API process may hold."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits
from vllm_omni.entrypoints.server.serving_state import socket_share
from vllm_omni.entrypoints.server.work_queue import WorkQueue
from vllm_omni.errors import RequestRefused


def test_a_full_queue_refuses_at_once_and_a_job_whose_caller_left_never_runs():
    async def scenario() -> list[str]:
        queue = WorkQueue("voice encoding", threads=1, limit=3)
        release = threading.Event()
        ran: list[str] = []

        def job(name: str) -> str:
            release.wait(30)
            ran.append(name)
            return name

        first = asyncio.create_task(queue.run(job, "first"))  # runs, and holds the thread
        await asyncio.sleep(0.05)
        left = asyncio.create_task(queue.run(job, "left"))  # waits behind it
        kept = asyncio.create_task(queue.run(job, "kept"))
        await asyncio.sleep(0.05)
        with pytest.raises(RequestRefused) as refused:
            await queue.run(job, "over")
        assert refused.value.status == 503 and refused.value.retry_after_s
        assert "3 voice encoding jobs are waiting or running" in str(refused.value)
        left.cancel()  # its client went away before the job started
        await asyncio.sleep(0.05)
        assert queue.jobs == 2
        release.set()
        assert await first == "first" and await kept == "kept"
        with pytest.raises(asyncio.CancelledError):
            await left
        assert queue.jobs == 0
        return ran

    assert asyncio.run(scenario()) == ["first", "kept"]


def test_the_count_is_running_and_waiting_jobs_when_their_callers_are_cancelled():
    async def scenario() -> None:
        queue = WorkQueue("prompt building", threads=1, limit=2)
        release = threading.Event()
        started = threading.Event()

        def job() -> None:
            started.set()
            release.wait(30)

        running = asyncio.create_task(queue.run(job))
        await asyncio.to_thread(started.wait, 30)
        waiting = asyncio.create_task(queue.run(job))
        await asyncio.sleep(0.05)
        running.cancel()  # its client left while the job ran: the thread is still busy with it
        await asyncio.gather(running, return_exceptions=True)
        assert queue.jobs == 2  # one running, one waiting
        with pytest.raises(RequestRefused, match="2 prompt building jobs are waiting or running"):
            await queue.run(job)
        waiting.cancel()  # not started: dropped, and no longer counted
        await asyncio.gather(waiting, return_exceptions=True)
        await asyncio.sleep(0.05)
        assert queue.jobs == 1
        release.set()
        for _ in range(100):
            if queue.jobs == 0:
                break
            await asyncio.sleep(0.02)
        assert queue.jobs == 0

    asyncio.run(scenario())


def test_websocket_sessions_leave_room_for_http_and_split_between_api_processes():
    assert socket_share(SpeechLimits(), max_num_seqs=16, processes=1) == 8
    assert socket_share(SpeechLimits(), max_num_seqs=16, processes=2) == 4
    assert socket_share(SpeechLimits(max_sockets=10), max_num_seqs=16, processes=3) == 3
    assert socket_share(SpeechLimits(), max_num_seqs=1, processes=4) == 1


def test_the_automatic_bounds_are_sized_from_the_engine_so_the_engines_is_met_first():
    auto = SpeechLimits().for_engine(max_num_seqs=16, processes=1, sockets=8)
    assert (auto.max_responses, auto.max_queued_jobs) == (32, 40)  # 16 slots and 16 waiting; every prompt fits
    split = SpeechLimits().for_engine(max_num_seqs=16, processes=2, sockets=4)
    assert (split.max_responses, split.max_queued_jobs) == (16, 20)
    given = SpeechLimits(max_responses=3, max_queued_jobs=5).for_engine(max_num_seqs=16, processes=1, sockets=8)
    assert (given.max_responses, given.max_queued_jobs) == (3, 5)
    assert (SpeechLimits().responses_bound, SpeechLimits().queued_jobs_bound) == (64, 16)  # before the engine
