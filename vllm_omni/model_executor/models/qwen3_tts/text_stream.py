"""Text that arrives in pieces, tokenized exactly as the whole text: tokens are committed once later text can
no longer change them.

The official prompt tokenizes ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` and takes
``ids[:3]`` as the role and ``ids[3:-5]`` as the text (:data:`ROLE`, :data:`END`). A byte-level BPE tokenizer
(Qwen2's) first splits its input at its **added tokens** (``<|im_end|>``, ``<|endoftext|>``, ``<tts_pad>``, ...:
the leftmost, then longest, string of one; each is one id), normalizes each part between them on its own (NFC
for the released checkpoints), cuts it into words with its pre-tokenizer regex and runs BPE inside each word.

Added tokens: a string of one that is whole and can no longer grow into a longer one ends the part before it, so
that part's words and the token's id are final. Text at the end that could still grow into one (``<|im_``) is
held, and nothing of what comes after where it starts is committed. An added token that strips the whitespace
around it, matches only as a single word, or is matched after normalization is handled conservatively: nothing
from it on (nor the whitespace before it) is committed before the end, and with a whitespace-stripping one in
the vocabulary no committed text ends with whitespace; a part whose normalized text holds an added token's
string is treated the same way.

Words: the regex scans left to right and looks at most one character past a match, so appended text can change
only the **last** word of a part so far and a run of whitespace words before it (``\\s*[\\r\\n]+`` reaches back
over whitespace to a newline that comes later): ``"3"`` ``"."`` ``"14"``: ``.`` stays a word of its own, ``1``
and ``4`` are words; ``"Hel"`` ``"lo"``: one word; trailing whitespace attaches to the next word.
:class:`IncrementalTokenizer` therefore commits the tokens of every word but those (and holds a word together
with the one before it where normalization could join them across the boundary: one starting with a combining
mark, which canonical reordering may compose into the letter before, or any pair the normalizer changes). Only
the uncommitted text is normalized, pre-tokenized and scanned for added tokens again as pieces arrive. At the
end it tokenizes the whole text the official way and checks that what it committed is a prefix of it (a safety
net: a text is refused, never spoken with other tokens than the whole text's).
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from typing import Any

from .prompt_builder import END, ROLE, ROLE_TOKENS, SpeechRequestError


class _Strings:
    """Added-token strings matched alike: leftmost, then longest (as ``tokenizers`` matches them), and which end
    of a text could still grow into one."""

    def __init__(self, contents: dict[str, int]) -> None:
        self.ids = contents
        self.pattern = re.compile("|".join(re.escape(s) for s in sorted(contents, key=len, reverse=True)))
        self.prefixes = {s[:k] for s in contents for k in range(1, len(s))}  # proper, non-empty
        self.longest = max(map(len, contents))

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        return self.pattern.search(text, pos)

    def growing(self, text: str, end: int, start: int = 0) -> int:
        """The first position from ``start`` from which ``text[:end]`` could still grow into one (``end``: none)."""
        for at in range(max(start, end - self.longest + 1), end):
            if text[at:end] in self.prefixes:
                return at
        return end


class _AddedTokens:
    """A tokenizer's added tokens, as its pipeline matches them."""

    def __init__(self, tokens: tuple[tuple[str, int, bool, bool], ...]) -> None:
        # tokens: (content, id, matched after normalization, strips whitespace or matches a single word only)
        raw = {content: id_ for content, id_, normalized, _ in reversed(tokens) if not normalized}
        normalized = {content: id_ for content, id_, normalized, _ in reversed(tokens) if normalized}
        self.raw = _Strings(raw) if raw else None  # matched in the text as sent
        self.unusual = frozenset(content for content, _, normalized, unusual in tokens if unusual and not normalized)
        self.normalized = _Strings(normalized) if normalized else None  # matched in each part's normalized text
        self.every = _Strings(raw | normalized) if tokens else None


@functools.lru_cache(maxsize=8)
def _added_tokens(tokens: tuple[tuple[str, int, bool, bool], ...]) -> _AddedTokens:
    return _AddedTokens(tokens)


def _last_starter(text: str) -> int:
    """Where the last character that later combining marks may still change starts."""
    at = len(text) - 1
    while at > 0 and unicodedata.combining(text[at]):
        at -= 1
    return max(at, 0)


class IncrementalTokenizer:
    """The token ids of ``ROLE + text + END`` as pieces of ``text`` arrive (:meth:`add`, then :meth:`finish`).

    :attr:`committed` grows only: it starts with ``<|im_start|>`` and holds the role's tokens, then the text's;
    after every piece it is a prefix of the whole text's ids. A tokenizer without a pre-tokenizer the class can
    read (not a ``tokenizers`` fast tokenizer) commits nothing before :meth:`finish`: the text is then spoken
    once it is whole, still exactly.
    """

    def __init__(self, tokenizer: Any, lock: Any = None) -> None:
        self.tokenizer = tokenizer
        self.lock = lock if lock is not None else threading.Lock()  # the tokenizer's users share one (Rust borrows)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pre_tokenizer = getattr(backend, "pre_tokenizer", None)
        self._normalizer = getattr(backend, "normalizer", None)
        self._strips = False  # an added token takes the whitespace on its left (the whitespace before it)
        self._added = self._read_added_tokens(backend)
        special, rest = ROLE.split(">", 1)
        self.committed: list[int] = self._ids(special + ">")
        self._pending = rest  # the text after what is committed, as sent (added tokens match before normalization)
        self.text = ""  # every piece as sent
        self.finished = False
        self.flushed = False  # flush() was called: the ids are the flushed parts' own, not the whole text's

    def _read_added_tokens(self, backend: Any) -> _AddedTokens | None:
        if self._pre_tokenizer is None:
            return None
        read = getattr(backend, "get_added_tokens_decoder", None)
        if read is None:  # added tokens unknown: commit nothing early
            self._pre_tokenizer = None
            return None
        with self.lock:
            decoder = read()
            skip_special = bool(getattr(backend, "encode_special_tokens", False))  # special tokens then are text
        tokens = tuple(
            (t.content, id_, bool(t.normalized), bool(t.lstrip or t.rstrip or t.single_word))
            for id_, t in sorted(decoder.items())
            if t.content and not (skip_special and t.special)
        )
        self._strips = any(t.lstrip for t in decoder.values() if t.content and not (skip_special and t.special))
        return _added_tokens(tokens) if tokens else None

    def _ids(self, text: str) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _normalize(self, text: str) -> str:
        if self._normalizer is None:
            return text
        with self.lock:
            return self._normalizer.normalize_str(text)

    @property
    def pending(self) -> str:
        """The text after what is committed, as sent."""
        return self._pending

    @property
    def text_ids(self) -> list[int]:
        """The text's committed token ids (after the role)."""
        return self.committed[ROLE_TOKENS:]

    def add(self, piece: str) -> list[int]:
        """Take the next piece; returns the text token ids it commits (often none)."""
        if self.finished:
            raise SpeechRequestError("text arrived after the end of the text")
        self.text += piece
        before = max(len(self.committed), ROLE_TOKENS)
        if self._pre_tokenizer is not None:
            pending = self._pending + piece
            cut, ids = self._final(pending)
            self.committed += ids
            self._pending = pending[cut:]
        return self.committed[before:]

    def _final(self, pending: str) -> tuple[int, list[int]]:
        """How much of ``pending`` later text can no longer change, and its token ids."""
        strings = self._added.raw if self._added is not None else None
        if strings is None:
            return self._part(pending, closed=False)
        ids: list[int] = []
        pos = 0
        while True:
            hold = strings.growing(pending, len(pending), pos)  # may still become an added token from there
            match = strings.search(pending, pos)
            if match is None or match.start() >= hold:
                done, got = self._part(pending[pos:hold], closed=False)
                return pos + done, ids + got
            start, end = match.span()
            if match.group() in self._added.unusual:  # strips whitespace or matches a single word only: not here
                while start > pos and pending[start - 1].isspace():
                    start -= 1
                done, got = self._part(pending[pos:start], closed=False)
                return pos + done, ids + got
            # Final: nothing before it can grow into an added token over it, nor can it grow into a longer one.
            done, got = self._part(pending[pos:start], closed=True)
            ids += got
            if done < start - pos:
                return pos + done, ids
            ids.append(strings.ids[match.group()])
            pos = end

    def _part(self, raw: str, closed: bool) -> tuple[int, list[int]]:
        """How much of ``raw`` (text between added tokens, or before a held one) is final, and its token ids.
        ``closed``: a final added token follows it, so all its words are final."""
        if not raw:
            return 0, []
        aligned = None
        text = raw
        if self._normalizer is not None:
            from tokenizers import NormalizedString

            aligned = NormalizedString(raw)
            with self.lock:
                self._normalizer.normalize(aligned)
            text = aligned.normalized
        end = len(text)
        if (
            self._added is not None
            and self._added.every is not None
            and (self._normalizer is not None or self._added.normalized is not None)
        ):
            # An added token's string in the normalized text (made by normalization, or one matched after it):
            # the tokenizer splits there, in a way this class does not follow: nothing from there on.
            match = self._added.every.search(text)
            if match is not None:
                end = match.start()
            if not closed and self._added.normalized is not None:
                end = min(end, self._added.normalized.growing(text, _last_starter(text)))
            if end < len(text):
                closed = False
                while end > 0 and text[end - 1].isspace():
                    end -= 1
        cut = len(text) if closed else self._final_words_end(text[:end])
        if cut == 0:
            return 0, []
        if cut == len(text) or aligned is None:
            done = len(raw) if cut == len(text) else cut
        else:  # the text as sent up to the cut (a mark composed into a letter is aligned to neither side: count it)
            done = len(raw) - len(aligned[cut:].original)
            if self._normalize(raw[:done]) != text[:cut]:
                return 0, []
        return done, self._ids(raw[:done])

    def _final_words_end(self, pending: str) -> int:
        """Where the words that later text can no longer change end in ``pending`` (0: none are final)."""
        with self.lock:
            starts = [start for _, (start, _) in self._pre_tokenizer.pre_tokenize_str(pending)]
        # Held with the last word: a word before it that is all whitespace (``\s*[\r\n]+`` takes a newline that
        # comes later into it: "\n" " " then "\n" is one word), and the word before one that normalization may
        # join to it (a combining mark: canonical reordering may compose it into that word's last letter); with
        # an added token that strips whitespace on its left, also a word before whitespace (it may take it).
        while len(starts) > 1 and (
            pending[starts[-2] : starts[-1]].isspace()
            or self._joins(pending, starts[-1])
            or (self._strips and pending[starts[-1] - 1].isspace())
        ):
            starts.pop()
        return starts[-1] if len(starts) > 1 else 0

    def _joins(self, text: str, at: int) -> bool:
        """Whether normalizing could change the text across ``at`` (a word boundary of normalized text)."""
        if unicodedata.combining(text[at]):
            return True
        pair = text[at - 1 : at + 1]
        return self._normalizer is not None and self._normalize(pair) != pair

    def flush(self) -> list[int]:
        """Commit the pending text as it stands (a client's explicit flush): its token ids, tokenized alone. From
        here on the committed ids need not equal the whole text's (a word cut by the flush is two words); the text
        after it is tokenized as if it started there, and :meth:`finish` no longer compares with the whole."""
        if self.finished:
            raise SpeechRequestError("text arrived after the end of the text")
        self.flushed = True
        before = max(len(self.committed), ROLE_TOKENS)
        if self._pending:
            self.committed += self._ids(self._pending)
            self._pending = ""
        return self.committed[before:]

    def finish(self) -> list[int]:
        """End of the text: the remaining text token ids. Raises :class:`SpeechRequestError` for an empty text, or
        when the whole text tokenizes differently from what was committed (never for a text this class reads
        right: a safety net)."""
        self.finished = True
        if not self.text.strip():
            raise SpeechRequestError("the text to speak is empty")
        if self.flushed:  # tokenized piecewise from the flush on: the rest alone
            before = max(len(self.committed), ROLE_TOKENS)
            self.committed += self._ids(self._pending) if self._pending else []
            self._pending = ""
            if not self.text_ids:
                raise SpeechRequestError("the text to speak is empty after tokenization")
            return self.committed[before:]
        whole = self._ids(f"{ROLE}{self.text}{END}")
        tail = len(self._ids(END))
        if whole[: len(self.committed)] != self.committed or len(whole) - tail < len(self.committed):
            raise SpeechRequestError(
                "the streamed text tokenizes differently once whole: send it in one piece, or as whole text"
            )
        before = max(len(self.committed), ROLE_TOKENS)
        self.committed = whole[: len(whole) - tail]
        if not self.text_ids:
            raise SpeechRequestError("the text to speak is empty after tokenization")
        return self.committed[before:]
