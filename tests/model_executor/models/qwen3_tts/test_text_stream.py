"""Text in pieces tokenized incrementally: the whole text's tokens, each committed as soon as it is final."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import END, ROLE, ROLE_TOKENS, SpeechRequestError
from vllm_omni.model_executor.models.qwen3_tts.text_stream import IncrementalTokenizer

pytestmark = pytest.mark.vllm  # the tokenizer loads with the serving venv's transformers (tests/conftest.py)

# The added tokens of the released Qwen3-TTS text tokenizer (Qwen3's, then the audio/TTS ones), all matched before
# normalization with no whitespace stripping; the test checkpoint's tokenizer has only <|endoftext|>, <|im_start|>,
# <|im_end|> and its own <|tts_pad|>, <|tts_text_bos|>, <|tts_text_eod|>.
QWEN_SPECIAL = [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>",
    "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]  # fmt: skip
QWEN_ADDED = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(talker_checkpoint: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(talker_checkpoint)


@pytest.fixture(scope="module")
def qwen_tokenizer(talker_checkpoint: Path):
    """The test tokenizer with the released tokenizer's other added tokens, as Qwen ships them."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(talker_checkpoint)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIAL]}
    )
    tokenizer.add_tokens([AddedToken(s, special=False, normalized=False) for s in QWEN_ADDED])
    return tokenizer


@pytest.fixture(scope="module")
def nested_tokenizer(talker_checkpoint: Path):
    """Added tokens inside others: "<tag>" starts "<tag>!" and is inside "q<tag>z"."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(talker_checkpoint)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(s, special=True, normalized=False) for s in ["<tag>", "<tag>!"]]}
    )
    tokenizer.add_tokens([AddedToken("q<tag>z", special=False, normalized=False)])
    return tokenizer


@pytest.fixture(scope="module")
def flagged_tokenizer(talker_checkpoint: Path):
    """Added tokens that strip whitespace, match a single word only, or match after normalization."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(talker_checkpoint)
    tokenizer.add_tokens(
        [
            AddedToken("<mask>", lstrip=True, normalized=False),
            AddedToken("<RS>", rstrip=True, normalized=False),
            AddedToken("[W]", single_word=True, normalized=False),
            AddedToken("<nm>", normalized=True),
            AddedToken("<K>", normalized=False),  # "<\u212a>" (Kelvin sign) is "<K>" once NFC-normalized
        ]
    )
    return tokenizer


def whole_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(f"{ROLE}{text}{END}", add_special_tokens=False)["input_ids"])[:-5]


def streamed(tokenizer, pieces: list[str]) -> tuple[list[int], list[int]]:
    """The committed ids once the text ends, and how many text ids were committed after each piece (before the
    end). Checks after every piece that what is committed is a prefix of the whole text's ids and that ``add``
    returns what it committed."""
    whole = whole_ids(tokenizer, "".join(pieces))
    stream, early = IncrementalTokenizer(tokenizer), []
    for piece in pieces:
        before = list(stream.committed)
        added = stream.add(piece)
        assert stream.committed[: len(before)] == before, (pieces, piece)
        assert added == stream.committed[max(len(before), ROLE_TOKENS) :], (pieces, piece)
        assert stream.committed == whole[: len(stream.committed)], (pieces, piece, stream.committed, whole)
        early.append(len(stream.text_ids))
    held = list(stream.committed)
    rest = stream.finish()
    assert stream.committed == whole, pieces
    assert rest == whole[max(len(held), ROLE_TOKENS) :], pieces
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
    _, early = streamed(tokenizer, pieces)
    assert early[-2] > 0  # every schedule has final words before its last piece: they are committed early


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_one_character_per_piece(tokenizer, name):
    text = "".join(SCHEDULES[name])
    _, early = streamed(tokenizer, list(text))
    assert early[-2] > 0


def test_each_piece_commits_the_words_it_makes_final(tokenizer):
    """After each piece of word_split, exactly the words no later text can change are committed."""
    stream = IncrementalTokenizer(tokenizer)
    for piece, final in zip(SCHEDULES["word_split"], ["", "Hello", "Hello there,", "Hello there, world"], strict=True):
        stream.add(piece)
        assert stream.text_ids == whole_ids(tokenizer, final)[ROLE_TOKENS:], (piece, final)


HOSTILE = [*"abcXYZ 3.14,!?'sd\n\r\t", "  ", "你", "好", "。", "😀", "é", "\u0301", "\u0323", "…", "ﬁ", "٣"]


def random_pieces(rng: random.Random, alphabet: list[str], longest: int) -> list[str]:
    text = ""
    while not text.strip():
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, longest)))
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_random_splits_of_hostile_text(tokenizer):
    rng = random.Random(0)
    for _ in range(400):
        streamed(tokenizer, random_pieces(rng, HOSTILE, 30))


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


# Added tokens: their own pieces, cut across pieces, glued to words, one after another.
ADDED_SCHEDULES = {
    "own_pieces": ["say", " <|im_end|>", " now", " please."],
    "cut_across": ["say <|im", "_end|> now ", "please"],
    "cut_across_2": ["say <|im", "_end|> now"],
    "one_char_each": ["<", "|", "im_end", "|>", "x"],
    "glued": ["a<|endoftext|>b", "c<|tts_pad|>", "d."],
    "consecutive": ["x <|im_end|>", "<|endoftext|><|tts_pad|>", " y<|im_start|><|im_", "end|>z"],
    "only_tokens": ["<|tts_pad|>", "<|tts_pad|>"],
    "not_a_token": ["say <|im_", "ending|> now", " and <|im_end", " <|tts", "_pad"],
    "ends_held": ["well <|im_", "start"],
    "whitespace_around": ["a \n", "<|im_end|>\n\n", " \t<|endoftext|>", "  b"],
    "combining_after": ["a <|im_end|>", "\u0301\u0338 b", " c>", "\u0338."],
    "newline_lookback": ["a\n ", "<|im_end|>", " \n", "\nb"],
}


@pytest.mark.parametrize("name", list(ADDED_SCHEDULES))
def test_added_tokens_are_committed_as_the_whole_text_has_them(tokenizer, name):
    pieces = ADDED_SCHEDULES[name]
    streamed(tokenizer, pieces)
    streamed(tokenizer, list("".join(pieces)))


def test_a_final_added_token_is_committed_at_once_and_a_possible_one_held(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stream = IncrementalTokenizer(tokenizer)
    stream.add("say <|im")
    assert stream.text_ids == whole_ids(tokenizer, "say")[ROLE_TOKENS:]  # " <|im" may be the start of a token
    held = len(stream.committed)
    assert stream.add("_end|>") == whole_ids(tokenizer, "say <|im_end|>")[held:]
    assert stream.text_ids[-1] == im_end and stream._pending == ""
    stream.add(" now")
    stream.add(" please.")
    assert stream.text_ids == whole_ids(tokenizer, "say <|im_end|> now please")[ROLE_TOKENS:]
    stream.finish()
    assert stream.committed == whole_ids(tokenizer, "say <|im_end|> now please.")


def test_a_token_that_may_still_grow_into_a_longer_one_is_held(nested_tokenizer):
    tag, bang = nested_tokenizer.convert_tokens_to_ids(["<tag>", "<tag>!"])
    stream = IncrementalTokenizer(nested_tokenizer)
    stream.add("a <tag")
    assert stream.add(">") == []  # "<tag>" may still be the start of "<tag>!"
    assert stream.add("x")[-1] == tag
    for pieces, token in (
        (["a <tag>", "! b"], bang),
        (["a <tag>", "!"], bang),
        (["a <tag>", "? b"], tag),
        (["aq<tag>", "z b"], nested_tokenizer.convert_tokens_to_ids("q<tag>z")),  # leftmost first
        (["aq<tag>", "y b"], tag),
    ):
        committed, _ = streamed(nested_tokenizer, pieces)
        assert token in committed, pieces
    rng = random.Random(4)
    strings = ["<tag>", "<tag>!", "q<tag>z", "q", "z", "!", "<ta", "g>", "<", ">"]
    for _ in range(300):
        streamed(nested_tokenizer, random_pieces(rng, [*"ab .", *strings], 16))


@pytest.mark.parametrize("name", list(ADDED_SCHEDULES))
def test_qwen_added_tokens(qwen_tokenizer, name):
    pieces = ADDED_SCHEDULES[name]
    streamed(qwen_tokenizer, pieces)
    for text in ("say <tool_call>x</tool_call> <think> hm</think>ok <tts_pad><tts_text_bos_single>y", "<|box_end|>"):
        streamed(qwen_tokenizer, list(text))
        streamed(qwen_tokenizer, text.split(" "))


ADDED_STRINGS = ["<|im_end|>", "<|endoftext|>", "<|tts_pad|>", "<|im_start|>", "<|im_", "<|", "|>", "<", ">"]
QWEN_STRINGS = ["<tts_pad>", "<tts_text_bos>", "<tts_text_bos_single>", "_single>", "<tts_", "<think>", "</think>"]


def test_random_splits_of_text_with_added_tokens(tokenizer, qwen_tokenizer):
    rng = random.Random(2)
    for _ in range(400):
        streamed(tokenizer, random_pieces(rng, [*HOSTILE, *ADDED_STRINGS, *ADDED_STRINGS], 24))
    for _ in range(300):
        streamed(qwen_tokenizer, random_pieces(rng, [*HOSTILE, *ADDED_STRINGS, *QWEN_STRINGS, *QWEN_STRINGS], 24))


def test_tokens_stripping_whitespace_or_matched_after_normalization_are_never_misspoken(flagged_tokenizer):
    """Held conservatively: what is committed is still the whole text's, and the end never refuses."""
    strings = ["<mask>", "<RS>", "[W]", "<nm>", "<K>", "<\u212a>", "<|im_end|>", "<", ">", "[", "W", "]", "nm", "K"]
    rng = random.Random(3)
    for _ in range(400):
        pieces = random_pieces(rng, [*"ab .\n", "  ", "é", "\u0301", *strings, *strings], 20)
        streamed(flagged_tokenizer, ["x" + pieces[0], *pieces[1:]])  # "<mask>" first would take the role's "\n"
    _, early = streamed(flagged_tokenizer, ["one two", " three", " <|im_end|> four", " five six"])
    assert early[-2] > 0  # text without such tokens is still committed early


# Normalization (NFC) across pieces: a mark composed into the letter before it, Hangul jamo into a syllable.
NFC_SCHEDULES = {
    "acute": ["e", "\u0301"],
    "acute_words": ["cafe", "\u0301", " and e", "\u0301\u0323", " x"],
    "reordered": ["o\u0301", "\u031b", "\u0323 a"],
    "jamo": ["\u1100", "\u1161", "\u11a8", " \u1100", "\u1161 x"],
    "jamo_syllable": ["가", "\u11a8 ", "나", "\u11ab."],
    "not_greater": ["a >", "\u0338 b", " =", "\u0338"],
}


@pytest.mark.parametrize("name", list(NFC_SCHEDULES))
def test_normalization_across_pieces(tokenizer, name):
    pieces = NFC_SCHEDULES[name]
    streamed(tokenizer, pieces)
    streamed(tokenizer, list("".join(pieces)))


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
            raw = "assistant\n" + sent
            committed = len(backend.normalizer.normalize_str(raw[: len(raw) - len(stream._pending)]))
            assert committed in boundaries, (text, sent, committed)
    for pieces in (["Hi\n ", "\n"], ["S\r \xa0", "\n"], ["\r\u3000", "\nok"], [" \n", " \n", "x"]):
        streamed(tokenizer, pieces)


def test_a_flush_commits_the_pending_word_as_it_stands(tokenizer):
    """The opt-in flush: the pending word's ids now, tokenized alone; the text after it is tokenized from there."""
    stream = IncrementalTokenizer(tokenizer)
    stream.add("Hello there, wor")
    before = list(stream.committed)
    flushed = stream.flush()
    assert stream.pending == "" and flushed and stream.committed == before + flushed
    assert stream.committed[: len(before)] == whole_ids(tokenizer, "Hello there, wor")[: len(before)]
    stream.add("ld and more.")
    stream.finish()
    after = list(tokenizer("ld and more.", add_special_tokens=False)["input_ids"])
    assert stream.committed == before + flushed + after
    empty = IncrementalTokenizer(tokenizer)
    empty.flush()
    with pytest.raises(SpeechRequestError, match="empty"):
        empty.finish()
