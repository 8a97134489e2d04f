"""What the edge routes of one API server process share, and how a process loads it.

Loading reads the plans that the start-up hand-off (``vllm serve --omni``, :mod:`..cli.serve`) built
or validated: sizes are checked, nothing is built or exported here, and no exporter is imported.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..openai.speech_api import PLACEHOLDER_VOICE
from ..openai.speech_limits import SpeechLimits, allowed_origins

if TYPE_CHECKING:  # imported where used (load_edge_state): the generator's module needs transformers and vLLM
    from ..generation.reference_fetch import MediaRules
    from ..generation.speech import AsyncCodecFrameGenerator
    from ..plans.edge_plans import ServedPlans
    from ..voices.voice_store import VoiceStore

logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply
T = TypeVar("T")


@dataclass
class EdgeServingState:
    """What the routes share: the plans, their JSON bytes, the frame generator on the engine, an open
    decoder of the server's CPU plan that keeps its session loaded (each request opens its own decoder
    on that shared session at no cost: the onnxruntime backend shares graphs by file), the limits, and
    bounded thread pools that keep CPU work off the event loop: one builds prompts (tokenizes, one
    thread: the tokenizer is not shared across threads), one decodes and encodes server-side audio, one
    encodes reference audio of cloned voices (Base), and one does the voice store's file work (stat, read,
    write, its lock: Base)."""

    plans: ServedPlans
    plan_bytes: dict[str, bytes]
    generator: AsyncCodecFrameGenerator
    limits: SpeechLimits
    served_models: tuple[str, ...]
    warm_decoder: Any = None
    voice_store: VoiceStore | None = None  # Base checkpoints
    prompt_pool: ThreadPoolExecutor | None = None
    decode_pool: ThreadPoolExecutor | None = None
    voice_pool: ThreadPoolExecutor | None = None
    voice_file_pool: ThreadPoolExecutor | None = None
    allowed_origins: tuple[str, ...] = ()  # --speech-allowed-origins, besides the server's own
    media_rules: MediaRules | None = None  # where ref_audio URLs may be fetched from (the engine's media settings)
    max_sockets: int = 1  # open speech WebSocket sessions at most (limits.max_sockets or max_num_seqs)
    open_sockets: int = 0

    def __post_init__(self) -> None:
        self.prompt_pool = self.prompt_pool or ThreadPoolExecutor(1, thread_name_prefix="speech-prompts")
        self.decode_pool = self.decode_pool or ThreadPoolExecutor(
            self.limits.decode_threads, thread_name_prefix="speech-decode"
        )
        self.voice_pool = self.voice_pool or ThreadPoolExecutor(1, thread_name_prefix="speech-voices")
        self.voice_file_pool = self.voice_file_pool or ThreadPoolExecutor(2, thread_name_prefix="speech-voice-files")

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Whether a WebSocket handshake's ``Origin`` may open a session: none (not a browser), the server's own
        (the handshake's ``Host``, http or https), or one of :attr:`allowed_origins` (a proxy that rewrites
        ``Host`` needs its public origin there)."""
        if origin is None:
            return True
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        if not host:
            return False
        # The server's own host, under either scheme: behind a TLS proxy the page is https while this hop is not.
        host = host.lower().removesuffix(":443").removesuffix(":80")
        page = origin.removeprefix("https://").removeprefix("http://").removesuffix(":443").removesuffix(":80")
        return origin.startswith(("http://", "https://")) and page == host

    def plan(self, name: str):
        """The published plan of class ``name``; a 404 naming the served classes otherwise (the plan routes answer it,
        the WebSocket closes with its text and code 4404)."""
        from ..openai.speech_api import SpeechApiError

        plan = self.plans.published.get(name)
        if plan is None:
            served = ", ".join(self.plans.published) or "none"
            raise SpeechApiError(404, f"hardware class {name!r} is not served here; served: {served}")
        return plan

    def uploads(self) -> VoiceStore:
        """The uploaded-voice store; a 400 for a checkpoint that is not Base (it speaks only its own voices)."""
        from ..openai.speech_api import SpeechApiError

        if self.voice_store is None:
            raise SpeechApiError(400, "voices are uploaded to Base checkpoints; this one has only its own voices")
        return self.voice_store

    async def encode_voice(self, request: Any) -> Any:
        """The voice ``request`` clones, its reference audio encoded on the voice pool (one thread: encoding
        seconds of audio never takes the decode pool's threads from live streams)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.voice_pool, self.generator.voice_prompt, request)

    async def voice_files(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, a call of the voice store (it stats, reads and writes files, and may wait for its
        lock while another process writes), on the voice-file pool: never on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.voice_file_pool, work, *args)

    async def resolve_voice(self, request: Any) -> Any:
        """``request`` with its cloned voice made (an uploaded one read, a reference URL fetched, off the loop), or
        as it is."""
        from ..openai.speech_api import ReferenceUrl

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
        stored = await self.voice_files(self.voice_store.get, name) if self.voice_store is not None else None
        if stored is None:
            return dataclasses.replace(request, uploaded_voice=None, speaker=name)
        request.check_one_voice()
        return dataclasses.replace(request, uploaded_voice=None, voice=stored.voice)

    async def prepare(self, request: Any, request_id: str) -> Any:
        """``request`` (a ``SpeechRequest``) as engine inputs: its voice made, then tokenized, off the event loop.

        Raises ``SpeechRequestError`` for a request the checkpoint cannot serve.
        """
        request = await self.resolve_voice(request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.prompt_pool, self.generator.build_request, request, request_id)

    async def decode(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the decode pool: at most ``limits.decode_threads`` run at once."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, work, *args)

    async def voices(self) -> dict[str, Any]:
        """``GET /v1/audio/voices`` as upstream vLLM-Omni answers it: ``voices``, every name a request may give
        (the checkpoint's speakers, uploaded voices and ``"default"``), sorted; ``uploaded_voices``, each
        described (:meth:`..voices.voice_store.StoredVoice.describe`); and ours, ``speakers``: the built-in
        speakers with their dialects (none for VoiceDesign and Base)."""
        config = self.generator.config
        dialects = config.talker_config.spk_is_dialect
        builtin = [] if config.tts_model_type in ("voice_design", "base") else config.supported_speakers
        uploaded = await self.voice_files(self.voice_store.list) if self.voice_store is not None else []
        names = sorted({*builtin, *(stored.name for stored in uploaded), PLACEHOLDER_VOICE})
        return {
            "voices": names,
            "uploaded_voices": [stored.describe() for stored in uploaded],
            "speakers": [{"name": name, "dialect": dialects.get(name.lower()) or None} for name in builtin],
        }


def served_model_names(args: Any) -> tuple[str, ...]:
    """The names a request's ``model`` may give: ``--served-model-name`` (every one), else the model."""
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):
        names = [names]
    return tuple(names or [getattr(args, "model_tag", None) or args.model])


async def load_edge_state(engine_client: Any, args: Any) -> EdgeServingState:
    """The state of one API server process: its plans (read, not built), the generator, a warm decoder."""
    from vllm_omni.edge.plan.model import PLAN_NAME
    from vllm_omni.edge.runtime import open_decoder

    from ..generation.reference_fetch import MediaRules
    from ..generation.speech import AsyncCodecFrameGenerator
    from ..plans.edge_plans import load_served_plans

    model = getattr(args, "model_tag", None) or args.model
    plans = load_served_plans(getattr(args, "edge_classes", []), Path(args.edge_artifacts))
    plan_bytes = {name: (p.directory / PLAN_NAME).read_bytes() for name, p in plans.published.items()}
    generator = await asyncio.to_thread(AsyncCodecFrameGenerator.for_engine, engine_client, model)
    # A long-lived server: weights repacked once for faster steps (prepack), and kept loaded.
    warm = await asyncio.to_thread(open_decoder, plans.server_decoder, check_sha256=False, prepack=True)
    limits = SpeechLimits.from_args(args)
    state = EdgeServingState(plans, plan_bytes, generator, limits, served_model_names(args), warm)
    state.allowed_origins = allowed_origins(args)
    state.media_rules = MediaRules.for_engine(engine_client.vllm_config.model_config, limits.max_body_bytes)
    state.max_sockets = limits.max_sockets or engine_client.vllm_config.scheduler_config.max_num_seqs
    if generator.config.tts_model_type == "base":
        from ..voices.voice_store import VoiceStore

        talker = generator.config.talker_config
        state.voice_store = await asyncio.to_thread(  # it makes its directory private: file work
            VoiceStore,
            Path(args.edge_artifacts) / "voices",
            limits.max_voices,
            limits.max_voice_bytes,
            talker.hidden_size,
            talker.num_code_groups,
            talker.codebook_size,
        )
        try:  # the encoders loaded now, so the first clone waits for no load
            await asyncio.get_running_loop().run_in_executor(state.voice_pool, generator.voice_encoders().warm_up)
        except Exception as error:  # a Base checkpoint without usable encoders: cloning fails per request
            logger.warning("voice cloning is unavailable: %s: %s", type(error).__name__, error)
    await warm_up(state)
    return state


async def warm_up(state: EdgeServingState) -> None:
    """One short utterance through the engine and the decoder, so the first client does not pay for it
    (the first steps of a fresh CPU engine are seconds slower than the next)."""
    import time

    from ..generation.speech import SpeechRequest

    config = state.generator.config
    speakers = config.supported_speakers
    kind = config.tts_model_type
    request = SpeechRequest(
        text="Hello.",
        speaker=speakers[0] if speakers and kind == "custom_voice" else None,
        instruct="A calm voice." if kind == "voice_design" else None,
        speaker_embedding=[0.0] * config.talker_config.hidden_size if kind == "base" else None,
        max_frames=2,
        greedy=True,
    )
    started = time.monotonic()
    try:
        request_id = f"speech-warm-up-{uuid.uuid4().hex}"  # unique: each API server process warms up
        prepared = await state.prepare(request, request_id)
        frames = [f async for f in state.generator.stream_prepared(prepared, request_id)]
        if frames:
            await state.decode(state.warm_decoder.feed, frames[0])
        await state.decode(state.warm_decoder.reset)
    except Exception as error:  # a warm-up that fails leaves the server as it was: slower first request
        logger.warning("speech warm-up failed (%s: %s); the first request will be slower", type(error).__name__, error)
        return
    logger.info("speech warm-up: %.1f s", time.monotonic() - started)
