"""Work in flight in one API server process, bounded per kind: speech responses (``--speech-max-responses``, a
batch counted as the items it runs at once) and voice uploads (``--speech-max-voice-uploads``). Past a bound a
request is refused at once (503 with ``Retry-After``), before it reads its body or fetches anything.

The request guard (:mod:`.request_guard`) holds one slot for each request it lets through; a batch
(:class:`BatchItems`) runs its first item on its own request's slot and any further item at once only on a slot
it can take then, so a batch of N items never runs more engine requests than the bound leaves free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from vllm_omni.errors import RequestRefused

from ..openai.speech_limits import SpeechLimits
from .work_queue import RETRY_AFTER_S

SPEECH_ROUTES = ("/v1/audio/speech", "/v1/audio/speech/batch")
VOICE_UPLOADS = "/v1/audio/voices"


class InFlight:
    """At most ``limit`` of one kind of work (``what``, set by ``flag``) at once in this process."""

    def __init__(self, what: str, limit: int, flag: str) -> None:
        self.what, self.limit, self.flag = what, limit, flag
        self.count = 0

    def refusal(self) -> RequestRefused | None:
        """The 503 for one more now, or None while there is room."""
        if self.count < self.limit:
            return None
        return RequestRefused(
            f"{self.count} {self.what} are in flight, the most this server process takes ({self.flag}): try again "
            "in a moment",
            503,
            RETRY_AFTER_S,
        )

    def take(self) -> bool:
        """One more, if there is room (True), else nothing (False)."""
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def give(self) -> None:
        self.count -= 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One slot held for the block (the caller checked :meth:`refusal` first)."""
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


@dataclass
class InFlightBounds:
    """The bounds of one API server process: speech responses (both HTTP speech routes) and voice uploads."""

    responses: InFlight
    uploads: InFlight

    @classmethod
    def for_limits(cls, limits: SpeechLimits) -> InFlightBounds:
        return cls(
            InFlight("speech responses", limits.responses_bound, "--speech-max-responses"),
            InFlight("voice uploads", limits.max_voice_uploads, "--speech-max-voice-uploads"),
        )

    def bound(self, method: str, path: str) -> InFlight | None:
        """The bound a request (``method``, route ``path``) counts against, or None."""
        if method != "POST":
            return None
        if path in SPEECH_ROUTES:
            return self.responses
        if path == VOICE_UPLOADS:
            return self.uploads
        return None


class BatchItems:
    """The items of one ``POST /v1/audio/speech/batch`` through the responses bound: one item at a time runs on the
    batch's own slot (the guard's); another runs beside it only on a slot it takes while one is free. An item
    never waits for a slot of another request's: when none is free it waits for one of its batch's items to end,
    so a batch always goes on, one item at a time at worst."""

    def __init__(self, responses: InFlight) -> None:
        self.responses = responses
        self.own_free = 1  # the batch request's own slot, when no item runs on it
        self.item_ended = asyncio.Event()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A slot for one item, held while the item's engine request runs."""
        while True:
            if self.own_free:
                self.own_free, extra = 0, False
                break
            if self.responses.take():
                extra = True
                break
            self.item_ended.clear()
            await self.item_ended.wait()
        try:
            yield
        finally:
            if extra:
                self.responses.give()
            else:
                self.own_free = 1
            self.item_ended.set()
