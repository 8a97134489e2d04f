"""What one API server process shares, one service per feature, and how a process loads it.

Loading reads the plans that the start-up hand-off (``vllm serve --omni``, :mod:`..cli.serve`) built
or validated: sizes are checked, nothing is built or exported here, and no exporter is imported.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..openai.speech_limits import SpeechLimits
from ..voices.voice_service import VoiceService
from .speech_service import SpeechService

if TYPE_CHECKING:
    from ..plans.edge_plans import ServedPlans

logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply


@dataclass
class SocketGate:
    """How many speech WebSocket sessions may be open at once in this process (who may open one is the request
    guard's to say: :mod:`.request_guard`)."""

    max_open: int = 1  # this process's share (socket_share)
    open: int = 0


@dataclass
class ServingState:
    """The features of one API server process: speech (:class:`SpeechService`), plans (``ServedPlans``), voices
    (:class:`VoiceService`, also the speech service's), and the WebSocket's gate."""

    speech: SpeechService
    plans: ServedPlans
    sockets: SocketGate = field(default_factory=SocketGate)
    watch: asyncio.Task | None = None  # the process's lifecycle watch (:mod:`.lifecycle`), kept referenced

    @property
    def voices(self) -> VoiceService:
        return self.speech.voices


def served_model_names(args: Any) -> tuple[str, ...]:
    """The names a request's ``model`` may give: ``--served-model-name`` (every one), else the model."""
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):
        names = [names]
    return tuple(names or [getattr(args, "model_tag", None) or args.model])


def socket_share(limits: SpeechLimits, max_num_seqs: int, processes: int) -> int:
    """The speech WebSocket sessions one of ``processes`` API processes may hold open: its share of
    ``--speech-max-sockets``, or of half the engine's ``max_num_seqs`` (the other half stays for HTTP requests)."""
    total = limits.max_sockets or max(1, max_num_seqs // 2)
    return max(1, total // max(1, processes))


async def load_serving_state(engine_client: Any, args: Any) -> ServingState:
    """The state of one API server process: its plans (read, not built), the generator, a warm decoder."""
    from vllm_omni.edge.runtime import open_decoder

    from ..generation.reference_fetch import MediaRules
    from ..generation.speech import AsyncCodecFrameGenerator
    from ..plans.edge_plans import load_served_plans

    model = getattr(args, "model_tag", None) or args.model
    plans = load_served_plans(getattr(args, "edge_classes", []), Path(args.edge_artifacts))
    generator = await asyncio.to_thread(AsyncCodecFrameGenerator.for_engine, engine_client, model)
    # A long-lived server: weights repacked once for faster steps (prepack), and kept loaded.
    warm = await asyncio.to_thread(open_decoder, plans.server_decoder, check_sha256=False, prepack=True)
    processes = getattr(args, "api_server_count", None) or 1
    max_num_seqs = engine_client.vllm_config.scheduler_config.max_num_seqs
    given = SpeechLimits.from_args(args)
    max_open = socket_share(given, max_num_seqs, processes)
    limits = given.for_engine(max_num_seqs, processes, max_open)  # the automatic bounds sized from the engine
    generator.stream_holds.hold_s = limits.stream_hold_s
    generator.stream_holds.share(processes)  # each API process holds its part
    voices = VoiceService()
    speech = SpeechService(generator, limits, served_model_names(args), plans.server_decoder, voices, warm)
    speech.media_rules = MediaRules.for_engine(engine_client.vllm_config.model_config, limits.max_body_bytes)
    state = ServingState(speech, plans, SocketGate(max_open))
    if generator.config.tts_model_type == "base":
        from ..voices.voice_store import VoiceStore

        talker = generator.config.talker_config
        voices.store = await asyncio.to_thread(  # it makes its directory private: file work
            VoiceStore,
            Path(args.edge_artifacts) / "voices",
            limits.max_voices,
            limits.max_voice_bytes,
            talker.hidden_size,
            talker.num_code_groups,
            talker.codebook_size,
        )
        try:  # the encoders loaded now, so the first clone waits for no load
            await speech.voice_work.run(generator.voice_encoders().warm_up)
        except Exception as error:  # a Base checkpoint without usable encoders: cloning fails per request
            logger.warning("voice cloning is unavailable: %s: %s", type(error).__name__, error)
    await warm_up(speech)
    return state


async def warm_up(speech: SpeechService) -> None:
    """One short utterance through the engine and the decoder, so the first client does not pay for it
    (the first steps of a fresh CPU engine are seconds slower than the next)."""
    import time

    from ..generation.speech import SpeechRequest

    config = speech.generator.config
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
        prepared = await speech.prepare(request, request_id)
        frames = [f async for f in speech.generator.stream_prepared(prepared, request_id)]
        if frames:
            await speech.decode(speech.warm_decoder.feed, frames[0])
        await speech.decode(speech.warm_decoder.reset)
    except Exception as error:  # a warm-up that fails leaves the server as it was: slower first request
        logger.warning("speech warm-up failed (%s: %s); the first request will be slower", type(error).__name__, error)
        return
    logger.info("speech warm-up: %.1f s", time.monotonic() - started)
