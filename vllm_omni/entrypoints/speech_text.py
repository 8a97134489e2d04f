"""Text arriving in pieces (an LLM's token stream, a typist) cut into the segments the talker speaks."""

from __future__ import annotations

# What ends a sentence, and what may close it after the mark (quotes, brackets).
SENTENCE_ENDS = frozenset(".!?;…。！？；")
WIDE_ENDS = frozenset("。！？；")  # CJK text puts no space after them
CLOSERS = frozenset("\"')]}”’»」』）")


class TextSegmenter:
    """Pieces joined as sent (whitespace pieces included) and cut after each sentence.

    A sentence ends at a run of end marks (``.!?;…`` and their CJK forms), closing quotes or brackets
    after it included, followed by whitespace or by the end of the piece it came in (a piece that ends a
    sentence is taken at its word: the talker starts on it without waiting for the next piece). Text that
    grows past ``max_chars`` without a sentence end is cut at its last whitespace. :meth:`flush` gives
    what is left (the client's ``flush`` or ``end``).
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.buffer = ""

    def add(self, piece: str) -> list[str]:
        """The segments ``piece`` completes, in order (often none)."""
        self.buffer += piece
        segments = []
        while (cut := self._cut()) is not None:
            segment, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:]
            if segment:
                segments.append(segment)
        return segments

    def flush(self) -> str | None:
        segment, self.buffer = self.buffer.strip(), ""
        return segment or None

    def _cut(self) -> int | None:
        text = self.buffer
        for index, char in enumerate(text):
            if char not in SENTENCE_ENDS:
                continue
            end = index + 1
            while end < len(text) and (text[end] in SENTENCE_ENDS or text[end] in CLOSERS):
                end += 1
            if end == len(text) or text[end].isspace() or text[end - 1] in WIDE_ENDS:
                return end
        if len(text) > self.max_chars:
            space = max((i for i, c in enumerate(text[: self.max_chars]) if c.isspace()), default=0)
            return space or self.max_chars
        return None
