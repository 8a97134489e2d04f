"""Codec frames from text with vLLM's engine: the offline and streaming API of the Qwen3-TTS talker.

    from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator, SpeechRequest
    gen = CodecFrameGenerator("DIR_OR_ID", dtype="float32", enforce_eager=True)   # other engine args pass through
    frames = gen.generate([SpeechRequest(text="Hello.", speaker="Ryan", language="English",
                                         max_frames=50, greedy=True)])        # list of int64 [T, 16]

``AsyncCodecFrameGenerator.stream(request)`` yields frames as the engine makes them. Sampling
defaults come from the checkpoint's ``generation_config.json`` as in the official package; ``greedy``
turns sampling off for codebook 0 and the residual codebooks alike.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import (
    OFFICIAL_GENERATION_DEFAULTS,
    Qwen3TTSConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.engine_contract import (
    FrameAssembler,
    TalkerRequestSpec,
    residual_logprobs,
)
from vllm_omni.model_executor.models.qwen3_tts.engine_settings import talker_engine_args
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import (
    PromptBuilder,
    SpeechPrompt,
    SpeechRequestError,
    VoiceClonePrompt,
)

from .stream_report import TalkerFailure

logger = logging.getLogger(__name__)

__all__ = ["AsyncCodecFrameGenerator", "CodecFrameGenerator", "SpeechRequest", "SpeechRequestError"]

MIN_NEW_TOKENS = 2  # the official generate bars EOS for the first two codebook-0 tokens
MAX_SEED = 2**63 - 1  # a seed the engine's generators take
SAMPLING_FIELDS = (
    *("temperature", "top_k", "top_p", "repetition_penalty"),
    *("subtalker_temperature", "subtalker_top_k", "subtalker_top_p"),
)


@dataclass(frozen=True)
class SpeechRequest:
    """One utterance. ``None`` fields take the checkpoint's generation defaults."""

    text: str | None  # None: the text arrives in pieces (AsyncCodecFrameGenerator.stream_text)
    speaker: str | None = None
    language: str | None = None  # a language name or "Auto"
    instruct: str | None = None
    # False: the text is fed as trailing text, one token per frame; None: the official default of the model
    # type (True for CustomVoice/VoiceDesign, False for Base's generate_voice_clone).
    non_streaming_mode: bool | None = None
    max_frames: int | None = None  # exactly this many frames at most; refused if the engine has no room for them
    # The official (and upstream vLLM-Omni's) cap: talker steps, N steps make N - 1 frames, within the engine's
    # room; None: the checkpoint's generation_config.json. max_frames wins where both are given.
    max_new_tokens: int | None = None
    greedy: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None
    seed: int | None = None
    # Voice cloning (Base checkpoints): reference audio (bytes of a WAV/FLAC/MP3/OGG file, a local path, or
    # (samples, sample_rate)) and its transcript; x_vector_only_mode uses the speaker embedding alone. Or a
    # precomputed speaker_embedding (x-vector only), or a voice made already (an uploaded voice).
    ref_audio: Any = None
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    speaker_embedding: Sequence[float] | None = None
    voice: VoiceClonePrompt | None = None
    # The name of an uploaded voice (a server's /v1/audio/voices): the server reads it into ``voice``, off its
    # event loop, before the request is built (SpeechService.resolve_voice).
    uploaded_voice: str | None = None

    def check_one_voice(self) -> None:
        """Refuse a request that gives more than one voice to clone (a voice prompt or stored voice, an uploaded
        voice's name, ``ref_audio``, ``speaker_embedding``): :class:`SpeechRequestError` naming them."""
        fields = ("voice", "uploaded_voice", "ref_audio", "speaker_embedding")
        given = [name for name in fields if getattr(self, name) is not None]
        if len(given) > 1:
            raise SpeechRequestError(f"give one voice to clone: {' and '.join(given)} were both given")


@dataclass(frozen=True)
class EngineRequest:
    """A :class:`SpeechRequest` as vLLM inputs."""

    prompt_ids: list[int]
    sampling_params: Any
    text_tokens: int = 0  # the text's and the instruction's tokens (usage)
    audio_tokens: int = 0  # reference frames of an in-context voice (usage)


def load_generation_defaults(model_dir: Path | None) -> dict[str, Any]:
    defaults = dict(OFFICIAL_GENERATION_DEFAULTS)
    path = model_dir / "generation_config.json" if model_dir else None
    if path is not None and path.is_file():
        defaults.update({k: v for k, v in json.loads(path.read_text()).items() if k in OFFICIAL_GENERATION_DEFAULTS})
    return defaults


class _SpeechFrontend:
    """What both generators share: the checkpoint's config, tokenizer, defaults and request building."""

    def _setup(self, model: str, engine_config: Any, max_model_len: int) -> None:
        from transformers import AutoTokenizer

        self.config: Qwen3TTSConfig = engine_config.hf_config
        talker = self.config.talker_config
        local = Path(model)
        generation = None if local.is_dir() else _hub_snapshot(model, ["generation_config.json"], required=False)
        self.defaults = load_generation_defaults(local if local.is_dir() else generation)
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.max_model_len = max_model_len
        self.prompts = PromptBuilder(self.config, tokenizer, max_prompt_positions=max_model_len - 2)
        self.frame_args = (talker.vocab_size, talker.codebook_size, talker.num_code_groups, talker.codec_eos_token_id)
        self.model = model
        self._voice_encoders = None
        self._voice_lock = threading.Lock()

    def voice_prompt(self, request: SpeechRequest) -> VoiceClonePrompt | None:
        """The voice ``request`` clones (``None`` for a preset or designed voice). Encoding reference audio is
        CPU work (the speaker encoder and the speech tokenizer's encoder): a server runs this off its loop."""
        if request.uploaded_voice is not None:  # a server reads it first (SpeechService.resolve_voice)
            raise SpeechRequestError(f"the uploaded voice {request.uploaded_voice!r} was not read")
        request.check_one_voice()
        if request.voice is not None:
            return request.voice
        if request.speaker_embedding is not None:
            if request.ref_text:
                raise SpeechRequestError("a speaker_embedding clones by x-vector only: it takes no ref_text")
            return VoiceClonePrompt(check_speaker_embedding(request.speaker_embedding, self.config))
        if request.ref_audio is None:
            if request.ref_text:
                raise SpeechRequestError("ref_text is the transcript of ref_audio: give the reference audio too")
            return None
        if self.config.tts_model_type != "base":
            raise SpeechRequestError(
                f"voice cloning needs a Base checkpoint; this one is {self.config.tts_model_type!r}"
            )
        if not request.x_vector_only_mode and not (request.ref_text or "").strip():
            raise SpeechRequestError(
                "in-context cloning needs ref_text, the transcript of ref_audio (or set x_vector_only_mode)"
            )
        from vllm_omni.model_executor.models.qwen3_tts.reference_audio import ReferenceAudioError

        from .reference_decoding import load_reference_audio

        try:
            samples = load_reference_audio(request.ref_audio)
        except ReferenceAudioError as error:
            raise SpeechRequestError(f"ref_audio: {error}") from None
        return self.voice_encoders().clone(samples, request.ref_text, request.x_vector_only_mode)

    def voice_encoders(self) -> Any:
        """The checkpoint's ``VoiceEncoders`` (Base), made once."""
        with self._voice_lock:
            if self._voice_encoders is None:
                from vllm_omni.model_executor.models.qwen3_tts.voice_encoders import VoiceEncoders

                local = Path(self.model)
                files = ["*.json", "model*.safetensors", "speech_tokenizer/*"]
                self._voice_encoders = VoiceEncoders(local if local.is_dir() else _hub_snapshot(self.model, files))
        return self._voice_encoders

    def build_request(self, request: SpeechRequest, request_key: str | None = None) -> EngineRequest:
        prompt = self.prompts.build(
            request.text,
            request.speaker,
            request.language,
            request.instruct,
            request.non_streaming_mode,
            voice=self.voice_prompt(request),
        )
        return self.engine_request(request, prompt, request_key)

    def engine_request(
        self, request: SpeechRequest, prompt: SpeechPrompt, request_key: str | None = None, *, text_open: bool = False
    ) -> EngineRequest:
        """``request`` with its ``prompt`` as vLLM inputs (``text_open``: the first chunk of a text stream)."""
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError

        d = self.defaults
        room = self.max_model_len - len(prompt.prompt_ids) - 1
        # Unset: max_new_tokens (the request's, else the checkpoint's; N talker steps give N - 1 frames) as a cap
        # within the engine's room.
        steps = request.max_new_tokens if request.max_new_tokens is not None else d["max_new_tokens"]
        max_frames = request.max_frames if request.max_frames is not None else max(1, min(steps - 1, room))
        if not isinstance(max_frames, int) or isinstance(max_frames, bool) or max_frames < 1:
            raise SpeechRequestError(f"max_frames must be a positive integer, got {max_frames!r}")
        if max_frames > room:
            raise SpeechRequestError(
                f"max_frames {max_frames} does not fit: the prompt takes {len(prompt.prompt_ids)} of the engine's "
                f"max_model_len {self.max_model_len} positions, leaving room for {room} frames"
            )
        if request.seed is not None and not (isinstance(request.seed, int) and 0 <= request.seed <= MAX_SEED):
            raise SpeechRequestError(f"seed must be an integer in [0, 2**63 - 1], got {request.seed!r}")
        greedy = (not d["do_sample"]) if request.greedy is None else request.greedy
        sub_greedy = (not d["subtalker_dosample"]) if request.greedy is None else request.greedy
        pick = lambda value, name: d[name] if value is None else value  # noqa: E731
        check_sampling({name: pick(getattr(request, name), name) for name in SAMPLING_FIELDS})
        greedy = greedy or float(pick(request.temperature, "temperature")) < 1e-5  # as vLLM reads temperature 0
        sub_greedy = sub_greedy or float(pick(request.subtalker_temperature, "subtalker_temperature")) < 1e-5
        try:
            spec = TalkerRequestSpec(
                request_key=request_key or uuid.uuid4().hex,
                trailing_text_ids=tuple(prompt.trailing_text_ids),
                text_open=text_open,
                repetition_penalty=float(pick(request.repetition_penalty, "repetition_penalty")),
                min_new_tokens=MIN_NEW_TOKENS,
                greedy=greedy,
                temperature=float(pick(request.temperature, "temperature")),
                top_k=max(0, int(pick(request.top_k, "top_k"))),
                top_p=float(pick(request.top_p, "top_p")),
                subtalker_greedy=sub_greedy,
                subtalker_temperature=float(pick(request.subtalker_temperature, "subtalker_temperature")),
                subtalker_top_k=int(pick(request.subtalker_top_k, "subtalker_top_k")),
                subtalker_top_p=float(pick(request.subtalker_top_p, "subtalker_top_p")),
                seed=request.seed,
                speaker_embedding=prompt.speaker_embedding,
                reference_codes=prompt.reference_codes,
            )
            TalkerRequestSpec.from_extra_args(spec.to_extra_args())  # the same checks the engine runs
            talker = self.config.talker_config
            spec.check_voice(talker.hidden_size, talker.num_code_groups, talker.codebook_size)
            params = SamplingParams(
                max_tokens=max_frames,  # the model makes frame j whole in the step that samples token j
                temperature=0.0,  # the model picks codebook 0 (spec.greedy ...): vLLM's sampler takes what it left
                stop_token_ids=[self.config.talker_config.codec_eos_token_id],
                logprobs=residual_logprobs(talker.num_code_groups),
                detokenize=False,
                skip_special_tokens=False,
                extra_args=spec.to_extra_args(),
            )
        except (ValueError, VLLMClientError) as error:  # checked above; vLLM's own checks are the last word
            raise SpeechRequestError(f"the engine refuses this request: {error}") from None
        return EngineRequest(prompt.prompt_ids, params, prompt.text_tokens, prompt.audio_tokens)

    def assembler(self) -> FrameAssembler:
        return FrameAssembler(*self.frame_args)


def check_sampling(values: dict[str, Any]) -> None:
    """Sampling settings in their ranges (finite temperatures >= 0, top_p in (0, 1], top_k -1 or >= 0,
    repetition_penalty > 0), each refused with its name before vLLM sees it."""
    for name, value in values.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise SpeechRequestError(f"{name} must be a finite number, got {value!r}")
        if "top_k" in name:
            ok, expected = float(number).is_integer() and number >= -1, "an integer, -1 (off) or >= 0"
        elif "top_p" in name:
            ok, expected = 0 < number <= 1, "in (0, 1]"
        elif name == "repetition_penalty":
            ok, expected = number > 0, "> 0"
        else:
            ok, expected = number >= 0, ">= 0"
        if not ok:
            raise SpeechRequestError(f"{name} must be {expected}, got {value!r}")


def check_speaker_embedding(values: Any, config: Qwen3TTSConfig) -> tuple[float, ...]:
    """A speaker embedding as the talker takes it: the talker's hidden size of finite numbers."""
    size = config.talker_config.hidden_size
    try:
        vector = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpeechRequestError(f"speaker_embedding must be {size} numbers") from None
    if vector.shape != (size,) or not np.isfinite(vector).all():
        raise SpeechRequestError(
            f"speaker_embedding must be {size} finite numbers (this checkpoint's talker size), got shape "
            f"{list(vector.shape)}"
        )
    return tuple(float(x) for x in vector)


def _hub_snapshot(model: str, files: list[str], required: bool = True) -> Path | None:
    """The local snapshot of hub model ``model`` holding ``files`` (patterns; vLLM fetched its weights already).
    Not ``required``: None, with a warning, when the hub cannot give them."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(snapshot_download(model, allow_patterns=files))
    except (HfHubHTTPError, OSError) as error:
        if required:
            raise
        logger.warning("no %s for %s (%s): the official hard defaults apply", files, model, error)
        return None


class CodecFrameGenerator(_SpeechFrontend):
    """Offline generation on ``vllm.LLM``: requests in, one ``int64[T, 16]`` array of frames per request."""

    def __init__(self, model: str | os.PathLike[str], **engine_args: Any) -> None:
        from vllm import LLM

        model = os.fspath(model)
        self.llm = LLM(model=model, **talker_engine_args(engine_args))
        model_config = self.llm.llm_engine.model_config
        self._setup(model, model_config, model_config.max_model_len)

    def generate(self, requests: Iterable[SpeechRequest], use_tqdm: bool = False) -> list[np.ndarray]:
        from vllm.inputs import TokensPrompt

        engine_requests = [self.build_request(r) for r in requests]
        if not engine_requests:
            return []
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in engine_requests],
            sampling_params=[r.sampling_params for r in engine_requests],
            use_tqdm=use_tqdm,
        )
        results = []
        for index, output in enumerate(outputs):
            completion = output.outputs[0]
            assembler = self.assembler()
            frames = assembler.feed(completion.token_ids, completion.logprobs)
            if assembler.failed:
                raise TalkerFailure(f"the engine could not go on with request {index}: see the server log")
            results.append(np.asarray(frames, dtype=np.int64).reshape(-1, self.config.talker_config.num_code_groups))
        return results

    def shutdown(self) -> None:
        """Stop the engine's processes now (otherwise they stop when this object is collected)."""
        self.llm.llm_engine.engine_core.shutdown()


class AsyncCodecFrameGenerator(_SpeechFrontend):
    """Streaming generation on ``AsyncLLM``: ``async for frames in gen.stream(request)``, frames as they are made."""

    def __init__(self, model: str | os.PathLike[str], stat_loggers: list | None = None, **engine_args: Any) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        model = os.fspath(model)
        args = AsyncEngineArgs(model=model, **talker_engine_args(engine_args))
        engine = AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)  # vLLM's StatLoggerFactory list
        self._attach(engine, model)

    @classmethod
    def for_engine(cls, engine: Any, model: str) -> AsyncCodecFrameGenerator:
        """A generator on an engine that is already running (the API server's ``EngineClient``)."""
        generator = cls.__new__(cls)
        generator._attach(engine, model)
        return generator

    def _attach(self, engine: Any, model: str) -> None:
        from .streamed_text import StreamHolds

        self.engine = engine
        model_config = engine.model_config
        self._setup(model, model_config, model_config.max_model_len)
        self.stream_holds = StreamHolds.for_engine(engine.vllm_config)  # paused text streams' KV, bounded

    async def stream(self, request: SpeechRequest, request_id: str | None = None) -> AsyncIterator[np.ndarray]:
        """Yields ``int64[n, 16]`` arrays (n >= 1) of new frames, in order, until the utterance ends.

        Closing the iterator early (a client that went away) aborts the request in the engine.
        """
        request_id = request_id or uuid.uuid4().hex
        async for frames in self.stream_prepared(self.build_request(request, request_key=request_id), request_id):
            yield frames

    async def stream_prepared(self, engine_request: EngineRequest, request_id: str) -> AsyncIterator[np.ndarray]:
        """:meth:`stream` for a request :meth:`build_request` made already (with ``request_key=request_id``):
        a server tokenizes off its event loop, then streams."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = engine_request.sampling_params
        params.output_kind = RequestOutputKind.DELTA
        assembler = self.assembler()
        groups = self.config.talker_config.num_code_groups
        finish = None
        async for output in self.engine.generate(
            TokensPrompt(prompt_token_ids=engine_request.prompt_ids), params, request_id
        ):
            completion = output.outputs[0]
            finish = completion.finish_reason or finish
            frames = assembler.feed(completion.token_ids, completion.logprobs)
            if frames:
                yield np.asarray(frames, dtype=np.int64).reshape(-1, groups)
        if assembler.failed:
            raise TalkerFailure("the engine could not go on with this request: see the server log")
        if finish == "abort":  # ended by the engine (a shutdown's, or a refusal), not by the utterance: never whole
            raise TalkerFailure("the engine ended the request before the utterance did: see the server log")

    def stream_text(
        self,
        request: SpeechRequest,
        pieces: AsyncIterable[str],
        request_id: str | None = None,
        text_timeout_s: float | None = None,
        report: Any = None,
    ) -> AsyncIterator[np.ndarray]:
        """:meth:`stream` for text that arrives while it is spoken: ``request.text`` is None and ``pieces`` (an async
        iterable of ``str``; its end is the end of the text) feed one running request in the streamed-text layout.

        Yields ``int64[n, 16]`` arrays of new frames as :meth:`stream` does, and an empty one (n = 0) each time the
        talker is held for text with every frame it can make sent; ``pieces`` may carry
        :data:`~.stream_report.FLUSH` (commit the pending word now). Greedy frames equal the whole text's
        (``non_streaming_mode=False``) whatever the arrival schedule: a step whose text has not arrived is held
        (:mod:`.streamed_text`). A text error (a non-string piece, an empty text, ``text_timeout_s`` seconds
        without a piece while the talker waits) is raised here. Closing the iterator aborts the request.
        ``report`` (a :class:`~.stream_report.StreamReport`) is filled in: what each frame had read of the text,
        and how the utterance ended.
        """
        from .streamed_text import stream_text

        return stream_text(self, request, pieces, request_id or uuid.uuid4().hex, text_timeout_s, report)

    def shutdown(self) -> None:
        self.engine.shutdown()
