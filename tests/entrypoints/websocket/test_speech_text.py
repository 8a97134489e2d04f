"""Text pieces cut into sentences, and frames regrouped for the wire: what the speech routes send the talker
and the client, without a server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vllm_omni.entrypoints.websocket.speech_text import TextSegmenter


def segments_of(pieces: list[str], max_chars: int = 4096) -> list[str]:
    segmenter = TextSegmenter(max_chars)
    out = [segment for piece in pieces for segment in segmenter.add(piece)]
    return out + ([rest] if (rest := segmenter.flush()) else [])


def test_token_pieces_join_with_their_whitespace_and_cut_at_sentence_ends():
    tokens = ["Hello", " there", ",", " this", " is", " a", " test", ".", " And", " more", "?", " ", "\n\n", "Done"]
    assert segments_of(tokens) == ["Hello there, this is a test.", "And more?", "Done"]


def test_whole_sentences_as_pieces_are_one_segment_each():
    assert segments_of(["", " ", "First one.", "\n\n", "Second one!", " "]) == ["First one.", "Second one!"]


def test_marks_inside_words_quotes_and_runs():
    assert segments_of(["Pi is 3.14 and e is 2.71 today. Next"]) == ["Pi is 3.14 and e is 2.71 today.", "Next"]
    assert segments_of(['He said "stop!" and left... Then?! ok']) == ['He said "stop!"', "and left...", "Then?!", "ok"]
    assert segments_of(["你好。今天天气很好！"]) == ["你好。", "今天天气很好！"]
    assert segments_of(["他说：“好。”然后走了。"]) == ["他说：“好。”", "然后走了。"]


def test_a_mark_that_ends_a_piece_waits_for_the_next_one():
    """Token streams split numbers and abbreviations: "3" "." "14" is one number, not two sentences."""
    assert segments_of(["Pi is 3", ".", "14 today", ".", " Next"]) == ["Pi is 3.14 today.", "Next"]
    segmenter = TextSegmenter(4096)
    assert segmenter.add("Hello.") == []  # not yet: the next piece says whether the sentence ended
    assert segmenter.add(" Bye") == ["Hello."]
    assert segmenter.flush() == "Bye"


def test_long_runs_of_marks_cost_their_length_once():
    segmenter = TextSegmenter(100_000)
    for _ in range(2000):
        assert segmenter.add("." * 8) == []
    assert segmenter.add(" x") == ["." * 16_000]


def test_text_without_sentence_ends_is_cut_at_whitespace_past_the_limit():
    words = " ".join(["word"] * 30)  # 149 characters
    pieces = segments_of([words], max_chars=40)
    assert all(len(p) <= 40 for p in pieces) and " ".join(pieces) == words
    assert segments_of(["x" * 50], max_chars=20) == ["x" * 20, "x" * 20, "x" * 10]


def test_whitespace_alone_says_nothing():
    assert segments_of([" ", "\n", "\t "]) == []


def test_frames_leave_first_alone_then_in_batches():
    from vllm_omni.entrypoints.server.speech_streams import frame_batches

    async def engine(deltas):
        for n in deltas:
            yield np.arange(n * 2, dtype=np.int64).reshape(n, 2)

    async def sizes(deltas, per_message):
        return [len(batch) async for batch in frame_batches(engine(deltas), per_message)]

    assert asyncio.run(sizes([1] * 10, 4)) == [1, 4, 4, 1]
    assert asyncio.run(sizes([3, 9], 4)) == [1, 4, 4, 3]
    assert asyncio.run(sizes([1] * 3, 1)) == [1, 1, 1]
    assert asyncio.run(sizes([], 4)) == []
    assert asyncio.run(sizes([1, 2, 0, 1, 0, 0, 5], 4)) == [1, 2, 1, 4, 1]  # empty: the talker waits, send all


@pytest.mark.parametrize("per_message", [1, 3, 4, 7])
def test_frame_batches_keep_every_frame_in_order(per_message):
    from vllm_omni.entrypoints.server.speech_streams import frame_batches

    rng = np.random.default_rng(per_message)
    deltas = [rng.integers(0, 100, (int(n), 16)) for n in rng.integers(1, 6, 20)]

    async def engine():
        for delta in deltas:
            yield delta

    async def collect():
        return [batch async for batch in frame_batches(engine(), per_message)]

    batches = asyncio.run(collect())
    np.testing.assert_array_equal(np.concatenate(batches), np.concatenate(deltas))
    assert len(batches[0]) == 1 and all(1 <= len(b) <= per_message for b in batches)
