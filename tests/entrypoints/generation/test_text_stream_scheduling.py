"""Paused text streams against an engine with few request slots and a small KV cache (tiny random-weight talker).

vLLM keeps a paused streaming session's KV blocks and request slot and never preempts it. These tests hold
``max_num_seqs`` sessions paused mid-text on an engine whose cache they could fill, and check that an ordinary
request is still served, that every session then finishes with the frames of its whole text (a released
session is recomputed exactly), that the engine's own KV usage returns to zero, and that a failure inside the
engine is reported as one, with what was spoken.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.entrypoints.generation.speech import AsyncCodecFrameGenerator, SpeechRequest
from vllm_omni.entrypoints.generation.stream_report import TalkerFailure
from vllm_omni.entrypoints.generation.streamed_text import (
    CHUNK_DEADLINE_S,
    HOLD_S,
    StreamHolds,
    StreamReport,
    TextSession,
)

from ..conftest import ENGINE, KvUsage, kv_freed

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

SLOTS = 4
TEXTS = [
    "Hello there, this is the first session speaking now, with a few more words to say before it pauses for a while.",
    "A second voice agent answers a question about the weather, then stops to look something up for its caller.",
    "The third one reads a recipe aloud, slowly and clearly, and waits for the cook to catch up with every step.",
    "And the fourth says goodbye before the line goes quiet, taking its time to find the right last words to use.",
]
FRAMES = 60


# Two engines, one bound each: few request slots (a KV cache with room to spare), or a KV cache the paused sessions
# could fill alone (request slots to spare). 32 KiB is one block of 32 positions of the tiny talker.
ENGINES = {
    "slots": {"max_num_seqs": SLOTS, "kv_cache_memory_bytes": 96 * (32 << 10)},
    "kv_blocks": {"max_num_seqs": 2 * SLOTS, "kv_cache_memory_bytes": 10 * (32 << 10)},
}


@pytest.fixture(scope="module")
def engines(talker_checkpoint: Path, engine_loop):
    """``engines(kind)``: the engine of ``ENGINES[kind]``, started when first asked for."""
    started: dict[str, AsyncCodecFrameGenerator] = {}

    def get(kind: str) -> AsyncCodecFrameGenerator:
        if kind not in started:
            settings = {**ENGINE, **ENGINES[kind], "max_model_len": 256}
            started[kind] = AsyncCodecFrameGenerator(talker_checkpoint, stat_loggers=[KvUsage], **settings)
        return started[kind]

    yield get
    for engine in started.values():
        engine.shutdown()


@pytest.fixture
def generator(engines):
    return engines("slots")


def request(**fields) -> SpeechRequest:
    return SpeechRequest(
        text=None, speaker="Aiden", language="English", greedy=True, max_frames=FRAMES, non_streaming_mode=False,
        **fields,
    )  # fmt: skip


async def collect(frames: AsyncIterator[np.ndarray]) -> np.ndarray:
    out = [batch async for batch in frames]
    return np.concatenate(out) if out else np.zeros((0, 16), dtype=np.int64)


async def all_at_once(text: str) -> AsyncIterator[str]:
    yield text


@pytest.mark.parametrize("kind", list(ENGINES))
def test_paused_sessions_leave_room_for_other_requests_and_end_with_their_whole_texts(kind, engines, engine_loop):
    generator = engines(kind)
    blocks = generator.engine.vllm_config.cache_config.num_gpu_blocks
    holds = generator.stream_holds
    slots = generator.engine.vllm_config.scheduler_config.max_num_seqs
    assert holds.max_sessions == slots // 2 and holds.max_blocks == (blocks - 1) // 2
    holds.hold_s = 600.0  # only the bounds release a session here, not the time it waits

    async def run():
        wholes = [await collect(generator.stream_text(request(), all_at_once(text))) for text in TEXTS]
        gates = [asyncio.Event() for _ in TEXTS]
        reports = [StreamReport() for _ in TEXTS]

        async def paused(text: str, gate: asyncio.Event) -> AsyncIterator[str]:
            cut = text.index(" ", 2 * len(text) // 3)
            yield text[:cut]
            await gate.wait()  # paused mid-text: the talker has spoken what it could and waits
            yield text[cut:]

        sessions = [
            asyncio.create_task(collect(generator.stream_text(request(), paused(text, gate), report=report)))
            for text, gate, report in zip(TEXTS, gates, reports, strict=True)
        ]
        # every session has spoken its first words and paused: held, or released past the bounds
        deadline = asyncio.get_running_loop().time() + 120
        while len(holds.held) + sum(report.releases for report in reports) < len(TEXTS):
            assert asyncio.get_running_loop().time() < deadline, f"sessions not paused in 120 s: {reports}"
            await asyncio.sleep(0.1)
        held = dict(holds.held)
        ordinary = dataclasses.replace(request(), text="An ordinary request while the others wait.")
        served = await asyncio.wait_for(collect(generator.stream(ordinary)), 120)  # never served, without the bounds
        for gate in gates:
            gate.set()
        streamed = await asyncio.wait_for(asyncio.gather(*sessions), 240)
        return wholes, served, streamed, reports, held, await kv_freed(generator, 10.0)

    try:
        wholes, served, streamed, reports, held, freed = engine_loop.run_until_complete(run())
    finally:
        holds.hold_s = HOLD_S
    assert served.shape[0] > 0  # served while SLOTS sessions were paused
    for whole, frames, report in zip(wholes, streamed, reports, strict=True):
        assert np.array_equal(frames, whole), "a paused and resumed stream differs from its whole text's frames"
        assert report.ending in ("complete", "eos", "max_frames") and report.frames == len(frames)
    assert held and len(held) <= holds.max_sessions and sum(held.values()) <= holds.max_blocks
    assert sum(report.releases for report in reports) >= len(TEXTS) - len(held)  # the others were released
    assert freed, "the engine's KV cache is not free"


def test_a_failure_inside_the_engine_is_reported_with_what_was_spoken(generator, engine_loop, monkeypatch):
    """A stream resumed with frames the engine cannot take (here, a codebook-0 id past the codec vocabulary) is
    ended by the engine; the client learns it failed, and how much was spoken, not that it completed."""
    original = TextSession._request

    def corrupted(self):
        if self.frames:
            self.frames[0] = [10**6, *self.frames[0][1:]]
        return original(self)

    monkeypatch.setattr(TextSession, "_request", corrupted)
    generator.stream_holds.hold_s = 0.2

    spoke = asyncio.Event()

    async def pauses() -> AsyncIterator[str]:
        yield TEXTS[0][:20]
        await spoke.wait()  # the talker has spoken the first words (a cold engine takes a while)
        await asyncio.sleep(1.0)  # past the hold: the session is released, then resumed
        yield TEXTS[0][20:]

    async def run():
        report, got = StreamReport(), []
        with pytest.raises(TalkerFailure, match="could not go on"):
            async for batch in generator.stream_text(request(), pauses(), report=report):
                got.append(batch)
                spoke.set()
        return report, sum(len(batch) for batch in got), await kv_freed(generator, 10.0)

    try:
        report, frames, freed = engine_loop.run_until_complete(run())
    finally:
        generator.stream_holds.hold_s = HOLD_S
    assert report.ending == "failed" and report.releases == 1
    assert report.frames == frames > 0 and 0 < report.spoken_chars <= 20
    assert freed


def test_a_chunk_not_scheduled_by_its_deadline_is_released_and_the_stream_resumes_exactly(generator, engine_loop):
    """Every chunk after the first given no time at all: each is released and resubmitted as a new request with
    the frames made so far; the utterance still has its whole text's frames, and nothing is left in the engine."""
    text = TEXTS[1]

    async def words() -> AsyncIterator[str]:
        for word in text.split(" ")[:8]:
            yield word + " "
            await asyncio.sleep(0.3)

    async def run():
        whole = await collect(generator.stream_text(request(), all_at_once(" ".join(text.split(" ")[:8]) + " ")))
        generator.stream_holds.chunk_deadline_s = 0.0
        report = StreamReport()
        try:
            streamed = await collect(generator.stream_text(request(), words(), report=report))
        finally:
            generator.stream_holds.chunk_deadline_s = CHUNK_DEADLINE_S
        return whole, streamed, report, await kv_freed(generator, 10.0)

    whole, streamed, report, freed = engine_loop.run_until_complete(run())
    assert np.array_equal(streamed, whole) and report.releases > 0 and freed


def test_holds_are_bounded_in_sessions_and_blocks_and_shared_between_api_processes():
    holds = StreamHolds(max_sessions=2, max_blocks=3, block_size=32)
    assert holds.hold("a", 64)  # 2 blocks
    assert not holds.hold("b", 33)  # 2 more: over the blocks
    assert holds.hold("c", 32)  # 1 more: 3 blocks, 2 sessions
    assert not holds.hold("d", 1)  # over the sessions
    holds.release("a")
    assert holds.hold("d", 1) and holds.held == {"c": 1, "d": 1}
    holds.share(2)
    assert (holds.max_sessions, holds.max_blocks) == (1, 1)
    assert not StreamHolds(max_sessions=0, max_blocks=9, block_size=32).hold("x", 1)  # one engine slot: never held
