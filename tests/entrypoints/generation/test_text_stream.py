"""Text that arrives while it is spoken (``AsyncCodecFrameGenerator.stream_text``): one running talker request
fed by a text stream equals the official ``generate`` with ``non_streaming_mode=False`` on the whole text, code
for code, whatever the arrival schedule, for every model type; it speaks before the text has all arrived.

Per model type one engine (tiny random-weight talker) runs the four schedules at once (all at once, pieces of
1-6 characters with random gaps, a 2.5 s pause mid-text, one character per piece) beside an ordinary request;
the official talker runs in ``.venv-oracle`` on the same checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.entrypoints.generation.speech import AsyncCodecFrameGenerator, SpeechRequest, SpeechRequestError

from ..conftest import kv_freed
from ..oracle import run_oracle

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

FRAMES = 50
PAUSE_S = 2.5
VOICES = Path(__file__).resolve().parents[2] / "fixtures" / "voices"
SCHEDULES = ("all_at_once", "random_pieces", "pause", "per_character")

# name -> (checkpoint kind, request fields, text)
CASES = {
    "custom_voice": (
        "custom_voice",
        {"speaker": "Aiden", "language": "English"},
        "She said she would be here by noon, and 3.14 apples were on the table.",
    ),
    "custom_voice_instruct": (
        "custom_voice",
        {"speaker": "Eric", "language": "Chinese", "instruct": "用特别愤怒的语气说"},
        "你今天到底在搞啥子嘛！我们走吧，今天天气很好。",
    ),
    "voice_design": (
        "voice_design",
        {"language": "English", "instruct": "A calm, deep voice."},
        "Good morning, how are you today? The quick brown fox jumps.",
    ),
    "base_in_context": (
        "base",
        {"language": "English", "ref_text": "She sells sea shells by the sea shore every summer morning."},
        "This sentence is a good deal longer than the short reference clip that it is spoken in, on purpose.",
    ),
    "base_x_vector": (
        "base",
        {"language": "English", "x_vector_only_mode": True},
        "Hello there, this is a cloned voice speaking as the text arrives.",
    ),
}


async def pieces(text: str, schedule: str, seed: int, log: list[float] | None = None) -> AsyncIterator[str]:
    """``text`` in pieces on ``schedule``; ``log`` gets each piece's send time (time.monotonic)."""
    rng = random.Random(seed)
    if schedule == "all_at_once":
        cuts = [len(text)]
    elif schedule == "per_character":
        cuts = list(range(1, len(text) + 1))
    else:
        cuts, at = [], 0
        while at < len(text):
            at = min(len(text), at + rng.randint(1, 6))
            cuts.append(at)
    start = 0
    for index, end in enumerate(cuts):
        if log is not None:
            log.append(time.monotonic())
        yield text[start:end]
        start = end
        if schedule == "pause" and index == len(cuts) // 3:
            await asyncio.sleep(PAUSE_S)
        elif schedule != "all_at_once":
            await asyncio.sleep(rng.random() * 0.03)


async def collect(frames: AsyncIterator[np.ndarray], times: list[float] | None = None) -> np.ndarray:
    out = []
    async for batch in frames:
        out.append(batch)
        if times is not None:
            times.extend([time.monotonic()] * len(batch))
    return np.concatenate(out) if out else np.zeros((0, 16), dtype=np.int64)


@pytest.fixture(scope="module")
def loop(engine_loop):
    """The session's loop of streaming engines (tests/entrypoints/conftest.py)."""
    return engine_loop


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory) -> Path:
    """0.6 s of the second reference voice: 8 frames, fewer than its transcript's tokens (the text to speak is all
    trailing text, held step by step)."""
    import wave

    from vllm_omni.entrypoints.generation.reference_decoding import load_reference_audio

    samples = load_reference_audio(VOICES / "ref_b_22k.wav")[: int(0.6 * 24_000)]
    path = tmp_path_factory.mktemp("clip") / "b_short.wav"
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(24_000)
        handle.writeframes(np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def checkpoints(talker_checkpoint: Path, voice_design_checkpoint: Path, base_checkpoint: Path) -> dict[str, Path]:
    return {"custom_voice": talker_checkpoint, "voice_design": voice_design_checkpoint, "base": base_checkpoint}


def reference_fields(name: str, short_clip: Path) -> dict:
    return {"ref_audio": str(short_clip if name == "base_in_context" else VOICES / "ref_a_22k.wav")}


@pytest.fixture(scope="module")
def official(checkpoints, short_clip, repo_root: Path, tmp_path_factory) -> dict[str, np.ndarray]:
    """The official talker's greedy frames of each case, the whole text in the streamed layout."""
    frames = {}
    for kind, checkpoint in checkpoints.items():
        names = [name for name, case in CASES.items() if case[0] == kind]
        requests = [
            {
                "text": CASES[name][2],
                **CASES[name][1],
                **(reference_fields(name, short_clip) if kind == "base" else {}),
                "non_streaming_mode": False,
                "max_new_tokens": FRAMES + 1,
                "greedy": True,
            }
            for name in names
        ]
        results = run_oracle(repo_root, checkpoint, tmp_path_factory.mktemp(f"oracle-{kind}"), requests)
        frames |= {name: np.asarray(r["codes"], dtype=np.int64) for name, r in zip(names, results, strict=True)}
    return frames


@pytest.fixture(scope="module")
def engines(checkpoints, streaming_engines) -> dict[str, AsyncCodecFrameGenerator]:
    """The session's streaming engine of each checkpoint (shared with test_speech.py)."""
    return {kind: streaming_engines.get(checkpoint) for kind, checkpoint in checkpoints.items()}


def request_of(name: str, generator: AsyncCodecFrameGenerator, short_clip: Path, **fields) -> SpeechRequest:
    kind, voice_fields, _ = CASES[name]
    voice_fields = dict(voice_fields)
    if kind == "base":
        clone = SpeechRequest(text=".", **voice_fields, **reference_fields(name, short_clip))
        voice_fields = {"language": voice_fields["language"], "voice": generator.voice_prompt(clone)}
    return SpeechRequest(**{"text": None, "max_frames": FRAMES, "greedy": True, **voice_fields, **fields})


@pytest.fixture(scope="module")
def streamed(engines, short_clip, loop) -> dict:
    """Per case: the frames of each schedule (all four at once), the piece and frame times of the paused one, and
    an ordinary whole-text request run beside them."""

    async def run(name: str) -> dict:
        generator = engines[CASES[name][0]]
        request, text = request_of(name, generator, short_clip), CASES[name][2]
        sent, received = [], []
        ordinary = SpeechRequest(**{**request.__dict__, "text": text, "non_streaming_mode": False})
        await collect(generator.stream(SpeechRequest(**{**ordinary.__dict__, "max_frames": 8})))  # a warm engine
        results = await asyncio.gather(
            *(
                collect(
                    generator.stream_text(request, pieces(text, schedule, seed, sent if schedule == "pause" else None)),
                    received if schedule == "pause" else None,
                )
                for seed, schedule in enumerate(SCHEDULES)
            ),
            collect(generator.stream(ordinary)),
        )
        return {"schedules": dict(zip(SCHEDULES, results, strict=False)), "ordinary": results[-1],
                "sent": sent, "received": received}  # fmt: skip

    return {name: loop.run_until_complete(run(name)) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_streamed_text_equals_the_official_whole_text_for_every_schedule(name, streamed, official):
    theirs = official[name]
    assert theirs.shape == (FRAMES, 16), "the oracle must produce the frames it is compared on"
    np.testing.assert_array_equal(streamed[name]["ordinary"], theirs, err_msg=f"{name}: whole text through stream()")
    for schedule, ours in streamed[name]["schedules"].items():
        mismatch = np.argwhere(ours != theirs) if ours.shape == theirs.shape else [[-1]]
        assert ours.shape == theirs.shape and len(mismatch) == 0, f"{name}/{schedule}: first mismatch {mismatch[0]}"


@pytest.mark.parametrize("name", ["custom_voice", "base_in_context"])
def test_frames_of_the_first_words_arrive_while_the_text_pauses(name, streamed):
    sent, received = streamed[name]["sent"], streamed[name]["received"]
    gaps = np.diff(sent)
    pause = int(np.argmax(gaps))
    assert gaps[pause] >= PAUSE_S - 0.1, "the schedule must pause mid-text"
    during = [t for t in received if sent[pause] < t < sent[pause + 1]]
    assert during, "no frame arrived during the pause: the talker waited for the whole text"
    assert any(t > sent[pause + 1] for t in received), "frames must also follow the rest of the text"


def test_sampled_frames_with_a_seed_equal_the_whole_texts(engines, short_clip, loop):
    generator, text = engines["custom_voice"], CASES["custom_voice"][2]

    async def run():
        request = request_of("custom_voice", generator, short_clip, greedy=False, seed=7)
        whole = SpeechRequest(**{**request.__dict__, "text": text, "non_streaming_mode": False})
        return await asyncio.gather(
            collect(generator.stream_text(request, pieces(text, "random_pieces", 3))),
            collect(generator.stream(whole)),
            collect(generator.stream(SpeechRequest(**{**whole.__dict__, "seed": 8}))),
        )

    streamed, whole, other = loop.run_until_complete(run())
    assert len(whole) > 2 and not np.array_equal(whole, other)
    np.testing.assert_array_equal(streamed, whole)


async def freed_within(generator: AsyncCodecFrameGenerator, seconds: float) -> bool:
    return await kv_freed(generator, seconds)


def test_bad_text_streams_fail_with_their_message_and_free_the_request(engines, short_clip, loop):
    generator, text = engines["custom_voice"], CASES["custom_voice"][2]
    request = request_of("custom_voice", generator, short_clip)

    async def bad(pieces_of: AsyncIterator, **kwargs) -> Exception | None:
        try:
            await collect(generator.stream_text(request, pieces_of, **kwargs))
        except SpeechRequestError as error:
            return error
        return None

    async def not_a_string():
        yield "Hello there, "
        await asyncio.sleep(0.3)
        yield 42

    async def never_ends():
        yield "Hello there, the rest "
        await asyncio.sleep(3600)
        yield "never comes."

    async def empty():
        yield "   "

    async def run():
        errors = [await bad(not_a_string()), await bad(never_ends(), text_timeout_s=1.0), await bad(empty())]
        freed = await freed_within(generator, 2.0)
        good = await collect(generator.stream_text(request, pieces(text, "random_pieces", 5)))
        return errors, freed, good

    errors, freed, good = loop.run_until_complete(run())
    assert "a text piece must be a str, got int" in str(errors[0])
    assert "no text arrived for 1 s" in str(errors[1])
    assert "the text to speak is empty" in str(errors[2])
    assert freed, "a failed text stream kept its request in the engine"
    assert good.shape == (FRAMES, 16)  # the engine serves on
    with pytest.raises(SpeechRequestError, match="set the request's text to None"):
        loop.run_until_complete(collect(generator.stream_text(SpeechRequest(text="x", speaker="Aiden"), empty())))


def test_closing_the_consumer_aborts_the_request(engines, short_clip, loop):
    generator = engines["custom_voice"]
    request = request_of("custom_voice", generator, short_clip, max_frames=400)

    async def run() -> bool:
        async def endless():
            yield "Hello there, this goes on "
            await asyncio.sleep(3600)

        frames = generator.stream_text(request, endless())
        await anext(frames)
        await frames.aclose()
        return await freed_within(generator, 2.0)

    assert loop.run_until_complete(run())


def test_a_text_longer_than_the_frame_budget_ends_at_it_and_frees_the_request(engines, short_clip, loop):
    """max_frames caps a streamed utterance as any other (the official max_new_tokens): the stream ends there,
    whether or not more text is still coming, and the request is freed."""
    generator, text = engines["custom_voice"], CASES["custom_voice"][2]
    request = request_of("custom_voice", generator, short_clip, max_frames=5)

    async def endless():
        yield text
        await asyncio.sleep(3600)

    frames = loop.run_until_complete(asyncio.wait_for(collect(generator.stream_text(request, endless())), 120))
    assert frames.shape == (5, 16)
    assert loop.run_until_complete(freed_within(generator, 2.0))


def test_a_short_text_cloned_in_context_fits_the_prompt_with_its_end(engines, loop):
    """In context, a reply shorter than the reference audio fits the prompt whole, ``tts_eos`` included: every
    talker step then adds ``tts_pad``, streamed or not."""
    generator = engines["base"]
    fields = dict(CASES["base_in_context"][1])
    clone = SpeechRequest(text=".", **fields, ref_audio=str(VOICES / "ref_b_22k.wav"))  # the whole clip: many frames
    voice = generator.voice_prompt(clone)
    assert len(voice.reference_codes) > 30
    request = SpeechRequest(text=None, language="English", voice=voice, max_frames=20, greedy=True)

    async def run():
        whole = await collect(generator.stream(dataclasses.replace(request, text="Yes.", non_streaming_mode=False)))
        streamed = [
            await collect(generator.stream_text(request, pieces("Yes.", schedule, 0))) for schedule in SCHEDULES
        ]
        return whole, streamed

    whole, streamed = loop.run_until_complete(run())
    assert whole.shape == (20, 16)
    for schedule, frames in zip(SCHEDULES, streamed, strict=True):
        np.testing.assert_array_equal(frames, whole, err_msg=schedule)
