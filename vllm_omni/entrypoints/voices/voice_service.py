"""The voices feature of one API server process: the uploaded-voice store (Base checkpoints) and the thread pool
its file work runs on, so the event loop never stats, reads, writes or waits for the store's lock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from vllm_omni.errors import RequestRefused

if TYPE_CHECKING:
    from .voice_store import StoredVoice, VoiceStore

T = TypeVar("T")


@dataclass
class VoiceService:
    """``store``: the uploaded voices (``None``: a checkpoint that speaks only its own voices)."""

    store: VoiceStore | None = None
    file_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="speech-voice-files")
    )

    def uploads(self) -> VoiceStore:
        """The store; a 400 for a checkpoint that is not Base (it speaks only its own voices)."""
        if self.store is None:
            raise RequestRefused("voices are uploaded to Base checkpoints; this one has only its own voices")
        return self.store

    async def files(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, a call of the store (it stats, reads and writes files, and may wait for its lock while
        another process writes), on the file pool: never on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.file_pool, work, *args)

    async def get(self, name: str) -> StoredVoice | None:
        """The uploaded voice ``name`` as it is on disk now, or ``None`` (none by that name, or no store)."""
        return await self.files(self.store.get, name) if self.store is not None else None

    async def uploaded(self) -> list[StoredVoice]:
        return await self.files(self.store.list) if self.store is not None else []
