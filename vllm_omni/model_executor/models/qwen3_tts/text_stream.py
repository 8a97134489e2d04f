"""Text that arrives in pieces, tokenized exactly as the whole text: tokens are committed once later text can
no longer change them.

The official prompt tokenizes ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` and takes
``ids[:3]`` as the role and ``ids[3:-5]`` as the text (:data:`ROLE`, :data:`END`). A byte-level BPE tokenizer
(Qwen2's) splits its input at added tokens, normalizes each part (NFC for the released checkpoints), cuts it
into words with its pre-tokenizer regex and runs BPE inside each word. The regex scans left to right and looks
at most one character past a match, so appended text can change only the **last** word of the text so far and a
run of whitespace words before it (``\\s*[\\r\\n]+`` reaches back over whitespace to a newline that comes later):
``"3"`` ``"."`` ``"14"``: ``.`` stays a word of its own, ``1`` and ``4`` are words; ``"Hel"`` ``"lo"``: one word;
trailing whitespace attaches to the next word. :class:`IncrementalTokenizer` therefore commits the tokens of
every word but those (and holds a word that starts with a combining mark together with the word before it:
canonical reordering may compose the mark into that word's last letter). At the end it tokenizes the whole text
the official way and checks that what it committed is a prefix of it: a text that breaks the rule (an
added-token string cut across pieces) is refused, never spoken with other tokens than the whole text's.
"""

from __future__ import annotations

import threading
import unicodedata
from typing import Any

from .prompt_builder import END, ROLE, ROLE_TOKENS, SpeechRequestError


class IncrementalTokenizer:
    """The token ids of ``ROLE + text + END`` as pieces of ``text`` arrive (:meth:`add`, then :meth:`finish`).

    :attr:`committed` grows only: it starts with ``<|im_start|>`` and holds the role's tokens, then the text's.
    A tokenizer without a pre-tokenizer the class can read (not a ``tokenizers`` fast tokenizer) commits nothing
    before :meth:`finish`: the text is then spoken once it is whole, still exactly.
    """

    def __init__(self, tokenizer: Any, lock: Any = None) -> None:
        self.tokenizer = tokenizer
        self.lock = lock if lock is not None else threading.Lock()  # the tokenizer's users share one (Rust borrows)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pre_tokenizer = getattr(backend, "pre_tokenizer", None)
        self._normalizer = getattr(backend, "normalizer", None)
        special, rest = ROLE.split(">", 1)
        self.committed: list[int] = self._ids(special + ">")
        self._pending = self._normalize(rest)  # the text after the committed words, normalized
        self.text = ""  # every piece as sent
        self.finished = False

    def _ids(self, text: str) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _normalize(self, text: str) -> str:
        if self._normalizer is None:
            return text
        with self.lock:
            return self._normalizer.normalize_str(text)

    @property
    def text_ids(self) -> list[int]:
        """The text's committed token ids (after the role)."""
        return self.committed[ROLE_TOKENS:]

    def add(self, piece: str) -> list[int]:
        """Take the next piece; returns the text token ids it commits (often none)."""
        if self.finished:
            raise SpeechRequestError("text arrived after the end of the text")
        self.text += piece
        if self._pre_tokenizer is None:
            return []
        pending = self._normalize(self._pending + piece)
        cut = self._final_words_end(pending)
        before = len(self.text_ids)
        if cut > 0:
            self.committed += self._ids(pending[:cut])
            pending = pending[cut:]
        self._pending = pending
        return self.text_ids[before:]

    def _final_words_end(self, pending: str) -> int:
        """Where the words that later text can no longer change end in ``pending`` (0: none are final)."""
        with self.lock:
            starts = [start for _, (start, _) in self._pre_tokenizer.pre_tokenize_str(pending)]
        # Held with the last word: a word before it that is all whitespace (``\s*[\r\n]+`` takes a newline that
        # comes later into it: "\n" " " then "\n" is one word), and the word before one that starts with a
        # combining mark (canonical reordering may compose the mark into that word's last letter).
        while len(starts) > 1 and (
            pending[starts[-2] : starts[-1]].isspace() or unicodedata.combining(pending[starts[-1]])
        ):
            starts.pop()
        return starts[-1] if len(starts) > 1 else 0

    def finish(self) -> list[int]:
        """End of the text: the remaining text token ids. Raises :class:`SpeechRequestError` for an empty text, or
        when the whole text tokenizes differently from what was committed."""
        self.finished = True
        if not self.text.strip():
            raise SpeechRequestError("the text to speak is empty")
        whole = self._ids(f"{ROLE}{self.text}{END}")
        tail = len(self._ids(END))
        if whole[: len(self.committed)] != self.committed or len(whole) - tail < len(self.committed):
            raise SpeechRequestError(
                "the streamed text tokenizes differently once whole (a special-token string split across "
                "pieces?): send it in one piece, or as whole text"
            )
        before = len(self.text_ids)
        self.committed = whole[: len(whole) - tail]
        if not self.text_ids:
            raise SpeechRequestError("the text to speak is empty after tokenization")
        return self.text_ids[before:]
