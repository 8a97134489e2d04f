"""Text in pieces tokenized incrementally: the whole text's tokens, each committed as soon as it is final."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import END, ROLE, SpeechRequestError
from vllm_omni.model_executor.models.qwen3_tts.text_stream import IncrementalTokenizer

pytestmark = pytest.mark.vllm  # the tokenizer loads with the serving venv's transformers (tests/conftest.py)


@pytest.fixture(scope="module")
def tokenizer(talker_checkpoint: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(talker_checkpoint)


def whole_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(f"{ROLE}{text}{END}", add_special_tokens=False)["input_ids"])[:-5]


def streamed(tokenizer, pieces: list[str]) -> tuple[list[int], list[int]]:
    """The committed ids, and how many text ids were committed before the last piece."""
    stream = IncrementalTokenizer(tokenizer)
    for piece in pieces[:-1]:
        stream.add(piece)
    early = len(stream.text_ids)
    stream.add(pieces[-1])
    stream.finish()
    return stream.committed, early


SCHEDULES = {
    "word_split": ["Hel", "lo th", "ere, wor", "ld."],
    "number": ["It costs 3", ".", "14", " dollars."],
    "cjk": ["今天", "天气", "很好", "。我们", "走吧"],
    "whitespace_pieces": ["", " ", "Hello", "\n\n", "  ", "again", " ", "\t", "now."],
    "emoji": ["Nice 😀", "😀 ", "🎉", "!"],
    "contraction": ["don", "'", "t do it, she", "'", "s here."],
    "combining": ["cafe", "\u0301 and o", "\u031b", "\u0301 and e", "\u0301"],
    "crlf": ["one\r", "\ntwo\r\n", "three"],
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_pieces_commit_exactly_the_whole_texts_tokens(tokenizer, name):
    pieces = SCHEDULES[name]
    committed, _ = streamed(tokenizer, pieces)
    assert committed == whole_ids(tokenizer, "".join(pieces))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_one_character_per_piece(tokenizer, name):
    text = "".join(SCHEDULES[name])
    assert streamed(tokenizer, list(text))[0] == whole_ids(tokenizer, text)


def test_random_splits_of_hostile_text(tokenizer):
    alphabet = [*"abcXYZ 3.14,!?'sd\n\r\t", "  ", "你", "好", "。", "😀", "é", "\u0301", "\u0323", "…", "ﬁ", "٣"]
    rng = random.Random(0)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        if not text.strip():
            continue
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert streamed(tokenizer, pieces)[0] == whole_ids(tokenizer, text), repr(pieces)


def test_words_are_committed_before_the_text_ends(tokenizer):
    stream = IncrementalTokenizer(tokenizer)
    assert stream.add("Hello") == []  # the word may still grow
    committed = stream.add(" there")
    assert committed and stream.text_ids == whole_ids(tokenizer, "Hello")[3:]
    assert stream.add(",") != []  # " there" is final once "," follows
    stream.add(" friend")
    held = len(stream.committed)
    assert stream.finish() == whole_ids(tokenizer, "Hello there, friend")[held:]  # the last word, at the end
    assert stream.committed == whole_ids(tokenizer, "Hello there, friend")


def test_empty_text_and_text_after_the_end_are_refused(tokenizer):
    stream = IncrementalTokenizer(tokenizer)
    stream.add("   ")
    with pytest.raises(SpeechRequestError, match="the text to speak is empty"):
        stream.finish()
    with pytest.raises(SpeechRequestError, match="after the end of the text"):
        stream.add("more")


def test_a_special_token_cut_across_pieces_is_refused_not_misspoken(tokenizer):
    stream = IncrementalTokenizer(tokenizer)
    for piece in ["say <|im", "_end|> now ", "please"]:
        stream.add(piece)
    with pytest.raises(SpeechRequestError, match="tokenizes differently once whole"):
        stream.finish()


def test_what_is_committed_always_ends_at_a_word_boundary_of_the_whole_text(tokenizer):
    """After every piece, the committed text ends where the whole text's pre-tokenizer puts a word boundary (so
    no BPE, however large, can tokenize it differently): whitespace runs before a later newline included."""
    backend = tokenizer.backend_tokenizer
    alphabet = [*"ab \n\r\t.3", "\u3000", "\xa0", "  ", "\n\n", "你", "\u0301"]
    rng = random.Random(1)
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        whole = backend.normalizer.normalize_str("assistant\n" + text)
        boundaries = {start for _, (start, _) in backend.pre_tokenizer.pre_tokenize_str(whole)} | {len(whole)}
        stream, sent = IncrementalTokenizer(tokenizer), ""
        for char in text:
            stream.add(char)
            sent += char
            committed = len(backend.normalizer.normalize_str("assistant\n" + sent)) - len(stream._pending)
            assert committed in boundaries, (text, sent, committed)
    for pieces in (["Hi\n ", "\n"], ["S\r \xa0", "\n"], ["\r\u3000", "\nok"], [" \n", " \n", "x"]):
        assert streamed(tokenizer, pieces)[0] == whole_ids(tokenizer, "".join(pieces))
