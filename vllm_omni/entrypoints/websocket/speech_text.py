"""Text arriving in pieces (an LLM's token stream, a typist) cut into the segments the talker speaks."""

from __future__ import annotations

MARKS = frozenset(".!?;…。！？；")
WIDE_MARKS = frozenset("。！？；")  # CJK text puts no space after them
CLOSERS = frozenset("\"')]}”’»」』）")


class TextSegmenter:
    """Pieces joined as sent (whitespace pieces included) and cut after each sentence.

    A sentence ends at a run of end marks (``.!?;…`` and their CJK forms), closing quotes or brackets
    after it included, followed by whitespace (after a CJK mark, by any text). A run that ends the text
    so far waits for the next piece, so a number or abbreviation split across tokens (``3`` ``.`` ``14``)
    is not cut; ``flush`` and ``end`` (:meth:`flush`) take what is left. Text that grows past
    ``max_chars`` without a sentence end is cut at its last whitespace. Each character is scanned once.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.buffer = ""
        self._position = 0  # the buffer before this is scanned
        self._run_wide: bool | None = None  # in a run of marks (and closers): whether it holds a CJK mark

    def add(self, piece: str) -> list[str]:
        """The segments ``piece`` completes, in order (often none)."""
        self.buffer += piece
        segments = []
        while (cut := self._cut()) is not None:
            segment, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:]
            self._position, self._run_wide = 0, None
            if segment:
                segments.append(segment)
        return segments

    def flush(self) -> str | None:
        segment = self.buffer.strip()
        self.buffer, self._position, self._run_wide = "", 0, None
        return segment or None

    def _cut(self) -> int | None:
        text = self.buffer
        for index in range(self._position, len(text)):
            char = text[index]
            if char in MARKS:
                self._run_wide = bool(self._run_wide) or char in WIDE_MARKS
            elif char in CLOSERS and self._run_wide is not None:
                pass
            else:
                ends = self._run_wide is not None and (self._run_wide or char.isspace())
                self._run_wide = None
                if ends:
                    return index
        self._position = len(text)
        if len(text) > self.max_chars:
            space = max(text.rfind(c, 0, self.max_chars) for c in " \n\t")
            return space if space > 0 else self.max_chars
        return None
