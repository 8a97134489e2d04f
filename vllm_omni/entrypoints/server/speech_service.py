"""The speech feature of one API server process: the talker's frame generator on the engine, the limits a client
cannot exceed, the decoder of the server's own CPU plan, and the bounded thread pools that keep CPU work off the
event loop: one builds prompts (tokenizes; one thread, the tokenizer is not shared across threads), one decodes and
encodes server-side audio, one encodes the reference audio of cloned voices (Base). Prompts and voices queue
boundedly (:class:`.work_queue.WorkQueue`: a 503 past ``--speech-max-queued-jobs``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..openai.speech_api import PLACEHOLDER_VOICE, ReferenceUrl
from ..openai.speech_limits import SpeechLimits
from ..voices.voice_service import VoiceService
from .speech_metrics import Meter
from .work_queue import WorkQueue

if TYPE_CHECKING:  # the generator's module needs transformers and vLLM: imported where the service is made
    from vllm_omni.edge.plan.model import ExecPlan

    from ..generation.reference_fetch import MediaRules
    from ..generation.speech import AsyncCodecFrameGenerator

T = TypeVar("T")
logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply


@dataclass
class SpeechService:
    """What every speech route and session uses. ``warm_decoder`` keeps the CPU plan's session loaded (each
    request opens its own decoder on that shared session at no cost: the onnxruntime backend shares graphs by
    file); ``voices`` is the voices feature (uploaded voices a request may name)."""

    generator: AsyncCodecFrameGenerator
    limits: SpeechLimits
    served_models: tuple[str, ...]
    server_decoder: ExecPlan  # the CPU plan PCM is decoded with
    voices: VoiceService = field(default_factory=VoiceService)
    warm_decoder: Any = None
    media_rules: MediaRules | None = None  # where ref_audio URLs may be fetched from (the engine's media settings)
    prompt_work: WorkQueue | None = None
    decode_pool: ThreadPoolExecutor | None = None
    voice_work: WorkQueue | None = None

    def __post_init__(self) -> None:
        queued = self.limits.queued_jobs_bound
        self.prompt_work = self.prompt_work or WorkQueue("prompt building", 1, queued)
        self.decode_pool = self.decode_pool or ThreadPoolExecutor(
            self.limits.decode_threads, thread_name_prefix="speech-decode"
        )
        self.voice_work = self.voice_work or WorkQueue("voice encoding", 1, queued)

    @property
    def config(self) -> Any:
        """The checkpoint's ``Qwen3TTSConfig``."""
        return self.generator.config

    @property
    def sample_rate(self) -> int:
        return self.server_decoder.codec.sample_rate

    def meter(self, route: str, text_mode: str = "whole", whole: bool = False) -> Meter:
        """A :class:`~.speech_metrics.Meter` for one utterance of ``route``, started now (``whole``: its audio leaves
        in one piece at the end)."""
        codec = self.server_decoder.codec
        return Meter(route, text_mode, codec.samples_per_frame / codec.sample_rate, whole=whole)

    async def encode_voice(self, request: Any) -> Any:
        """The voice ``request`` clones, its reference audio encoded on the voice pool (one thread: encoding
        seconds of audio never takes the decode pool's threads from live streams; bounded, and dropped when its
        caller is cancelled before it starts: :class:`.work_queue.WorkQueue`)."""

        def encode() -> Any:
            started = time.monotonic()
            voice = self.generator.voice_prompt(request)
            logger.info("voice encoded in %.2f s", time.monotonic() - started)  # a job that ran (not one dropped)
            return voice

        return await self.voice_work.run(encode)

    async def resolve_voice(self, request: Any) -> Any:
        """``request`` with its cloned voice made (an uploaded one read, a reference URL fetched, off the loop), or
        as it is."""
        if isinstance(request.ref_audio, ReferenceUrl):
            request = dataclasses.replace(request, ref_audio=await self.fetch_reference(request.ref_audio))
        if request.uploaded_voice is not None:
            request = await self.uploaded_voice(request)
        if request.ref_audio is None and request.speaker_embedding is None:
            return request
        voice = await self.encode_voice(request)
        return dataclasses.replace(request, voice=voice, ref_audio=None, speaker_embedding=None, ref_text=None)

    async def fetch_reference(self, url: str) -> bytes:
        """The reference audio at ``url`` under the engine's media rules (:mod:`..generation.reference_fetch`)."""
        from ..generation.reference_fetch import MediaRules, fetch_reference

        return await fetch_reference(url, self.media_rules or MediaRules(self.limits.max_body_bytes))

    async def uploaded_voice(self, request: Any) -> Any:
        """``request`` with the uploaded voice it names read from the store as it is now (the file may have been
        replaced through another API server process). A name that is not an uploaded voice is left to the
        checkpoint to refuse as a speaker (a Base checkpoint has no preset speakers)."""
        name = request.uploaded_voice
        stored = await self.voices.get(name)
        if stored is None:
            return dataclasses.replace(request, uploaded_voice=None, speaker=name)
        request.check_one_voice()
        return dataclasses.replace(request, uploaded_voice=None, voice=stored.voice)

    async def prepare(self, request: Any, request_id: str) -> Any:
        """``request`` (a ``SpeechRequest``) as engine inputs: its voice made, then tokenized, off the event loop.

        Raises a :class:`~vllm_omni.errors.RequestRefused` for a request the checkpoint cannot serve.
        """
        request = await self.resolve_voice(request)
        return await self.prompt_work.run(self.generator.build_request, request, request_id)

    async def decode(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the decode pool: at most ``limits.decode_threads`` run at once."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, work, *args)

    async def voice_list(self) -> dict[str, Any]:
        """``GET /v1/audio/voices`` as upstream vLLM-Omni answers it: ``voices``, every name a request may give
        (the checkpoint's speakers, uploaded voices and ``"default"``), sorted; ``uploaded_voices``, each
        described (:meth:`..voices.voice_store.StoredVoice.describe`); and ours, ``speakers``: the built-in
        speakers with their dialects (none for VoiceDesign and Base)."""
        config = self.config
        dialects = config.talker_config.spk_is_dialect
        builtin = [] if config.tts_model_type in ("voice_design", "base") else config.supported_speakers
        uploaded = await self.voices.uploaded()
        names = sorted({*builtin, *(stored.name for stored in uploaded), PLACEHOLDER_VOICE})
        return {
            "voices": names,
            "uploaded_voices": [stored.describe() for stored in uploaded],
            "speakers": [{"name": name, "dialect": dialects.get(name.lower()) or None} for name in builtin],
        }
