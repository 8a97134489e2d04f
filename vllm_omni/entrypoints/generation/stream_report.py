"""What a streamed-text utterance reports (:class:`StreamReport`), the flush marker its pieces may carry
(:data:`FLUSH`) and the error of a request the engine failed (:class:`TalkerFailure`): plain data, importable where
the model code is not (the WebSocket layer)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_omni.errors import RequestRefused


class TalkerFailure(RequestRefused):
    """The engine ended a request it could not go on with (its state did not fit a step; the server log says
    why), or ended it before the utterance did. Raised after the frames made before the failure; a 500."""

    status = 500


class _Flush:
    def __repr__(self) -> str:
        return "FLUSH"


# Sent among the pieces: commit the pending word now (a client's opt-in flush; the ids from there on need not equal
# the whole text's, see ``IncrementalTokenizer.flush``).
FLUSH: Any = _Flush()

# How an utterance ended (StreamReport.ending):
ENDINGS = {
    "complete": "the talker ended after speaking the whole text",
    "eos": "the talker ended before the text did: the rest was not spoken",
    "max_frames": "the frame budget (max_frames) ran out: the rest of the text was not spoken",
    "failed": "the utterance failed: see the message",
    "cancelled": "the utterance was stopped by its client",
}


@dataclasses.dataclass
class StreamReport:
    """How one streamed-text utterance went, filled in while it runs.

    ``frame_chars[j]``: the characters of the text (as sent) that the step making frame ``j`` had read;
    ``text_chars``: all characters received; ``ending`` (:data:`ENDINGS`) and ``message`` once it ended;
    ``releases``: how often its KV cache was released (a pause past the hold bounds, a chunk past its deadline).
    """

    frame_chars: list[int] = dataclasses.field(default_factory=list)
    text_chars: int = 0
    ending: str | None = None
    message: str = ""
    releases: int = 0

    @property
    def frames(self) -> int:
        return len(self.frame_chars)

    @property
    def spoken_chars(self) -> int:
        """The characters the frames sent had read (all of them once the utterance is complete)."""
        return self.frame_chars[-1] if self.frame_chars else 0

    def end(self, ending: str, message: str = "") -> None:
        if self.ending is None:
            self.ending, self.message = ending, message
