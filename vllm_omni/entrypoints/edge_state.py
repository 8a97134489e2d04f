"""What the edge routes of one API server process share, and how a process loads it.

Loading reads the plans that the start-up hand-off (``vllm serve --omni``, :mod:`.cli.serve`) built
or validated: sizes are checked, nothing is built or exported here, and no exporter is imported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .speech_limits import SpeechLimits

logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply
T = TypeVar("T")


@dataclass
class EdgeServingState:
    """What the routes share: the plans, their JSON bytes, the frame generator on the engine, an open
    decoder of the server's CPU plan that keeps its session loaded (each request opens its own decoder
    on that shared session at no cost: the onnxruntime backend shares graphs by file), the limits, and
    two bounded thread pools that keep CPU work off the event loop: one builds prompts (tokenizes, one
    thread: the tokenizer is not shared across threads), one decodes and encodes server-side audio."""

    plans: Any  # edge_plans.ServedPlans
    plan_bytes: dict[str, bytes]
    generator: Any  # speech.AsyncCodecFrameGenerator
    limits: SpeechLimits
    served_models: tuple[str, ...]
    warm_decoder: Any = None
    prompt_pool: ThreadPoolExecutor | None = None
    decode_pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.prompt_pool = self.prompt_pool or ThreadPoolExecutor(1, thread_name_prefix="speech-prompts")
        self.decode_pool = self.decode_pool or ThreadPoolExecutor(
            self.limits.decode_threads, thread_name_prefix="speech-decode"
        )

    def plan(self, name: str):
        """The published plan of class ``name``; an HTTP 404 naming the served classes otherwise."""
        from fastapi import HTTPException

        plan = self.plans.published.get(name)
        if plan is None:
            served = ", ".join(self.plans.published) or "none"
            raise HTTPException(404, f"hardware class {name!r} is not served here; served: {served}")
        return plan

    async def prepare(self, request: Any, request_id: str) -> Any:
        """``request`` (a ``SpeechRequest``) as engine inputs, tokenized off the event loop.

        Raises ``SpeechRequestError`` for a request the checkpoint cannot serve.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.prompt_pool, self.generator.build_request, request, request_id)

    async def decode(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the decode pool: at most ``limits.decode_threads`` run at once."""
        return await asyncio.get_running_loop().run_in_executor(self.decode_pool, work, *args)

    def voices(self) -> list[dict[str, Any]]:
        """The checkpoint's built-in speakers (a VoiceDesign checkpoint has none: ``instructions`` describe it)."""
        config = self.generator.config
        dialects = config.talker_config.spk_is_dialect
        return [
            {"name": name, "type": "builtin", "dialect": dialects.get(name.lower()) or None}
            for name in config.supported_speakers
        ]


def artifact_files(plan) -> dict[str, tuple[str, int]]:
    """Every file a device downloads for ``plan``: name -> (sha256, size)."""
    files = {a.file: (a.sha256, a.size_bytes) for a in plan.artifacts.values()}
    files |= {
        a.source["file"]: (a.source["sha256"], a.source["size_bytes"]) for a in plan.artifacts.values() if a.source
    }
    return files


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

    from .edge_plans import load_served_plans
    from .speech import AsyncCodecFrameGenerator

    model = getattr(args, "model_tag", None) or args.model
    plans = load_served_plans(getattr(args, "edge_classes", []), Path(args.edge_artifacts))
    plan_bytes = {name: (p.directory / PLAN_NAME).read_bytes() for name, p in plans.published.items()}
    generator = await asyncio.to_thread(AsyncCodecFrameGenerator.for_engine, engine_client, model)
    # A long-lived server: weights repacked once for faster steps (prepack), and kept loaded.
    warm = await asyncio.to_thread(open_decoder, plans.server_decoder, check_sha256=False, prepack=True)
    state = EdgeServingState(plans, plan_bytes, generator, SpeechLimits.from_args(args), served_model_names(args), warm)
    await warm_up(state)
    return state


async def warm_up(state: EdgeServingState) -> None:
    """One short utterance through the engine and the decoder, so the first client does not pay for it
    (the first steps of a fresh CPU engine are seconds slower than the next)."""
    import time

    from .speech import SpeechRequest

    config = state.generator.config
    speakers = config.supported_speakers
    request = SpeechRequest(
        text="Hello.",
        speaker=speakers[0] if speakers and config.tts_model_type != "voice_design" else None,
        instruct="A calm voice." if config.tts_model_type == "voice_design" else None,
        max_frames=2,
        greedy=True,
    )
    started = time.monotonic()
    try:
        prepared = await state.prepare(request, "speech-warm-up")
        frames = [f async for f in state.generator.stream_prepared(prepared, "speech-warm-up")]
        if frames:
            await state.decode(state.warm_decoder.feed, frames[0])
        await state.decode(state.warm_decoder.reset)
    except Exception as error:  # a warm-up that fails leaves the server as it was: slower first request
        logger.warning("speech warm-up failed (%s: %s); the first request will be slower", type(error).__name__, error)
        return
    logger.info("speech warm-up: %.1f s", time.monotonic() - started)
