"""The body of ``POST /v1/audio/speech`` (and of batch items and WebSocket sessions), its checks, its request.

OpenAI's fields (``model``, ``input``, ``voice``, ``instructions``, ``response_format``, ``speed``,
``stream_format``), upstream vLLM-Omni's (``task_type``, ``language``, ``stream``, ``max_new_tokens``,
``initial_codec_chunk_frames``, ``extra_params``, ``word_timestamps``, the voice-cloning fields, ``voice`` as
``speaker`` or ``{"id": ...}``), the edge's (``edge_hardware``, ``frames_per_message``) and the generator's own,
under their :class:`~..generation.speech.SpeechRequest` names (:data:`GENERATOR_FIELDS`). :func:`check_body`
refuses what the server will not do before any tokenization, and :func:`with_upstream_meaning` gives upstream's
fields upstream's meaning (a voice it ignores dropped, the default voice, ``extra_params`` applied):
each refusal is a :class:`SpeechApiError` with the HTTP status and a message of ours. Where OpenAI and upstream
disagree, OpenAI wins on OpenAI's fields (``response_format`` defaults to ``mp3``) and upstream on its own
(``stream`` alone means server-sent events); ``docs/serving/serve.md`` lists every difference.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from vllm_omni.errors import RequestRefused

from .speech_limits import SpeechLimits

CODEC_MEDIA_TYPE = "application/x-qwen3-tts-codec-stream"
SSE_MEDIA_TYPE = "text/event-stream"
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}
MAX_NAME_CHARS = 256  # voice, language, model, edge_hardware
MAX_NEW_TOKENS = 4096  # upstream's bound on max_new_tokens
MAX_FRAMES_PER_MESSAGE = 256
DEFAULT_SPEAKER = "vivian"  # upstream's voice when none is given (a CustomVoice checkpoint without it: its first)
PLACEHOLDER_VOICE = "default"  # upstream's "no voice in particular"

# SpeechRequest fields a speech request may set under their own names (the rest are OpenAI's).
GENERATOR_FIELDS = (
    "non_streaming_mode",
    "max_frames",
    "greedy",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
)
# What ``extra_params`` may set (upstream copies its sampling keys onto the talker's sampling parameters).
EXTRA_PARAMS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "greedy")


class SpeechApiError(RequestRefused):
    """A request the speech routes refuse: ``status`` (HTTP) and a message saying what to send instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, status)


class BodyShapeError(SpeechApiError):
    """A body that is not a speech request at all (not an object, a field of the wrong type or out of its range),
    as opposed to a request this checkpoint or server cannot serve."""


def speech_body_model() -> Any:
    """The pydantic model of the body: OpenAI's fields, upstream vLLM-Omni's, the edge's, and the generator's."""
    import dataclasses
    import typing

    from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, model_validator

    from ..generation.speech import SpeechRequest
    from .speech_audio import AUDIO_FORMATS

    class OpenAISpeech(BaseModel):
        model_config = ConfigDict(allow_inf_nan=False)  # JSON's NaN and Infinity are not numbers here

        model: str | None = None
        input: str
        # upstream's alias `speaker`; OpenAI's voice object {"id": ...} and upstream's "default" (no voice in
        # particular) are read by _voice_forms below.
        voice: str | None = Field(default=None, validation_alias=AliasChoices("voice", "speaker"))
        instructions: str | None = None
        language: str | None = None
        task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
        response_format: Literal[(*AUDIO_FORMATS, "codec")] = "mp3"  # OpenAI's default
        speed: float = 1.0
        # None: `stream` decides (upstream: true alone means server-sent events); "audio": the bytes as decoded.
        stream_format: Literal["audio", "sse"] | None = None
        stream: bool = False
        edge_hardware: str | None = None
        frames_per_message: int = Field(default=4, ge=1, le=MAX_FRAMES_PER_MESSAGE)
        # Upstream's: the talker's steps (1-4096), the first chunk's frames (0: the server's choice, one frame),
        # sampling keys, word timing (needs an aligner model this server does not have: refused when true).
        max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
        initial_codec_chunk_frames: int | None = Field(default=None, ge=0, le=MAX_FRAMES_PER_MESSAGE)
        extra_params: dict[str, Any] | None = None
        word_timestamps: bool = False
        # Voice cloning (Base checkpoints); `voice` may also name an uploaded voice (/v1/audio/voices).
        ref_audio: str | None = None  # a data:, http(s):// or file:// URL, or bare base64
        ref_text: str | None = None
        x_vector_only_mode: bool = False
        speaker_embedding: list[float] | None = None

        @model_validator(mode="before")
        @classmethod
        def _voice_forms(cls, data: Any) -> Any:
            if not isinstance(data, dict):
                return data
            key = "voice" if "voice" in data else "speaker"
            voice = data.get(key)
            if isinstance(voice, dict):  # OpenAI's custom-voice object
                if not isinstance(voice.get("id"), str):
                    raise ValueError('a voice object needs a string "id" (the voice\'s name)')
                data = {**data, key: voice["id"]}
            elif isinstance(voice, str) and voice.strip().lower() in ("", PLACEHOLDER_VOICE):
                data = {**data, key: None}
            return data

        @property
        def sse(self) -> bool:
            """Server-sent events: ``stream_format`` ``sse``, or ``stream`` true without a ``stream_format``."""
            return self.stream_format == "sse" or (self.stream and self.stream_format is None)

        @property
        def streamed(self) -> bool:
            """The body sent as it is decoded (``stream`` or ``stream_format`` ``audio``), not whole at the end."""
            return self.stream or self.stream_format is not None

        @property
        def first_frames(self) -> int:
            return self.initial_codec_chunk_frames or 1

    hints = typing.get_type_hints(SpeechRequest)
    generator = {
        f.name: (hints[f.name], f.default) for f in dataclasses.fields(SpeechRequest) if f.name in GENERATOR_FIELDS
    }
    return create_model("SpeechBody", __base__=OpenAISpeech, **generator)


def validation_message(error: Any) -> str:
    """A pydantic ``ValidationError`` as one line: where, what was wrong (not the input echoed back)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"invalid speech request: {where}: {first['msg']}"


def parse_json(data: bytes | str, what: str = "the body") -> Any:
    """JSON text as Python values; a :class:`SpeechApiError` (400) for anything else, deep nesting included."""
    try:
        return json.loads(data)
    except RecursionError:
        raise SpeechApiError(400, f"{what} is JSON nested too deeply; a speech request is one flat object") from None
    except ValueError as error:  # also UnicodeDecodeError
        raise SpeechApiError(400, f"{what} is not JSON ({type(error).__name__} at {_where(error)})") from None


def _where(error: ValueError) -> str:
    position = getattr(error, "pos", None)
    if position is None:
        position = getattr(error, "start", None)
    return f"byte {position}" if position is not None else "the start"


def check_text(name: str, text: str | None, limit: int, flag: str | None = None) -> None:
    """``text`` fits ``limit`` characters and is text (no lone surrogate from a ``\\ud800`` escape)."""
    if text is None:
        return
    if len(text) > limit:
        where = f" (--{flag})" if flag else ""
        raise SpeechApiError(
            400,
            f"{name} is {len(text)} characters; this server takes at most {limit}{where}: "
            + ("split the text into several requests or WebSocket pieces" if name == "input" else "shorten it"),
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SpeechApiError(
            400, f"{name} is not valid Unicode text: a lone surrogate at character {error.start}"
        ) from None


def check_model(model: str | None, served_models: tuple[str, ...]) -> None:
    """A request's ``model`` (None: any) among the served names, else a 404 listing them: the names, never a
    checkpoint's path (a local checkpoint's path is accepted, not listed)."""
    if model is not None and model not in served_models:
        listed = [name for name in served_models if not os.path.isdir(name)] or ["(see --served-model-name)"]
        raise SpeechApiError(404, f"model {model!r} is not served here; served: {', '.join(listed)}")


def check_body(body: Any, limits: SpeechLimits, served_models: tuple[str, ...], tts_model_type: str) -> None:
    """What :func:`speech_body_model` cannot check alone: the limits, the served model, the format's options."""
    from .speech_audio import AudioFormatError, check_speed

    check_text("input", body.input, limits.max_input_chars, "speech-max-input-chars")
    check_text("instructions", body.instructions, limits.max_instructions_chars, "speech-max-instructions-chars")
    check_text("ref_text", body.ref_text, limits.max_input_chars, "speech-max-input-chars")
    for name in ("voice", "language", "model", "edge_hardware"):
        check_text(name, getattr(body, name), MAX_NAME_CHARS)
    check_model(body.model, served_models)
    task_type = body.task_type or ("Base" if body.ref_audio or body.ref_text else None)  # upstream infers Base
    if task_type is not None and TASK_TYPES[task_type] != tts_model_type:
        inferred = "" if body.task_type else " (inferred from ref_audio/ref_text)"
        served = next((name for name, kind in TASK_TYPES.items() if kind == tts_model_type), tts_model_type)
        raise SpeechApiError(
            400,
            f"task_type {task_type}{inferred} does not match the served model ({served}): send task_type {served}"
            " or leave it out" + (", and no ref_audio/ref_text" if task_type == "Base" else ""),
        )
    if body.word_timestamps:
        raise SpeechApiError(
            400,
            "word_timestamps needs a forced-aligner model (upstream's --forced-aligner), which this server does not "
            "run: drop word_timestamps",
        )
    if body.max_new_tokens is not None and body.max_frames is not None:
        raise SpeechApiError(400, "give max_new_tokens (talker steps, upstream's) or max_frames (frames), not both")
    try:
        check_speed(body.speed)
    except AudioFormatError as error:
        raise SpeechApiError(400, str(error)) from None
    if body.response_format == "codec":
        if body.edge_hardware is None:
            raise SpeechApiError(400, "response_format codec needs edge_hardware (GET /v1/edge/hardware lists them)")
        if body.speed != 1.0:
            raise SpeechApiError(
                400, "speed applies to audio the server decodes; a codec stream is decoded on the device at speed 1"
            )
        if body.stream_format == "sse":
            raise SpeechApiError(
                400, "stream_format sse carries audio; a codec stream is binary: use stream_format audio"
            )


def speech_body(model: Any, data: Any, limits: SpeechLimits, served_models: tuple[str, ...], config: Any) -> Any:
    """``data`` (parsed JSON) as a body of ``model`` (:func:`speech_body_model`), checked (:func:`check_body`) and
    with upstream's meaning (:func:`with_upstream_meaning`) for the checkpoint ``config``; a
    :class:`SpeechApiError` otherwise."""
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise BodyShapeError(400, f"a speech request is one JSON object, got {type(data).__name__}")
    try:
        body = model.model_validate(data)
    except ValidationError as error:
        raise BodyShapeError(400, validation_message(error)) from None
    check_body(body, limits, served_models, config.tts_model_type)
    return with_upstream_meaning(body, config.tts_model_type, config.supported_speakers)


def with_upstream_meaning(body: Any, model_type: str, speakers: list[str]) -> Any:
    """``body`` (checked by :func:`check_body`) with upstream vLLM-Omni's fields given upstream's meaning:
    ``extra_params`` applied (its sampling keys only), and the voice a checkpoint ignores dropped (upstream's
    clients always send one): VoiceDesign has none (the instruction describes it), Base takes reference audio or
    an embedding before a name; CustomVoice without a voice speaks :data:`DEFAULT_SPEAKER` (or the checkpoint's
    first speaker). ``max_new_tokens`` travels as it is: a cap on the talker's steps (``SpeechRequest``)."""
    updates: dict[str, Any] = {}
    for key, value in (body.extra_params or {}).items():
        if key not in EXTRA_PARAMS:
            allowed = ", ".join(EXTRA_PARAMS)
            raise SpeechApiError(400, f"extra_params.{key} is not taken here; extra_params may set {allowed}")
        if getattr(body, key) is not None and getattr(body, key) != value:
            raise SpeechApiError(400, f"{key} is given twice with different values (the body and extra_params)")
        updates[key] = value
    voice = body.voice
    if model_type == "voice_design" or (model_type == "base" and (body.ref_audio or body.speaker_embedding)):
        voice = None
    elif model_type == "custom_voice" and voice is None and speakers:
        voice = DEFAULT_SPEAKER if DEFAULT_SPEAKER in [s.lower() for s in speakers] else speakers[0]
    if voice != body.voice:
        updates["voice"] = voice
    if not body.extra_params:  # the voice alone: a value of the body's own type, nothing to validate again
        return body.model_copy(update=updates) if updates else body
    from pydantic import ValidationError

    try:  # validated again: extra_params' values are checked as the fields they set
        return type(body).model_validate({**body.model_dump(), **updates, "extra_params": None})
    except ValidationError as error:
        message = validation_message(error).replace("invalid speech request: ", "extra_params: ")
        raise SpeechApiError(400, message) from None


class ReferenceUrl(str):
    """A ``ref_audio`` that names where the audio is (``http(s)://`` or ``file://``): the server fetches it under
    its media rules (:mod:`..generation.reference_fetch`) before the voice is made."""


def decode_audio_field(value: str, name: str = "ref_audio") -> bytes | ReferenceUrl:
    """The bytes of an audio file sent as base64 or as a ``data:`` URL, or the :class:`ReferenceUrl` to fetch."""
    import base64
    import binascii

    text = value.strip()
    scheme = text[:16].partition("://")[0].lower() if "://" in text[:16] else ""
    if scheme in ("http", "https", "file"):
        return ReferenceUrl(text)
    if scheme:
        raise SpeechApiError(400, f"{name}: {scheme}:// is not fetched; send an http(s)://, file:// or data: URL")
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise SpeechApiError(400, f"{name}: a data URL must be base64 (data:audio/wav;base64,...)")
    try:  # line breaks and spaces (the base64 command wraps at 76 columns) are not data
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        if text.startswith(("/", "./", "../", "~")) or text[1:3] == ":\\":
            raise SpeechApiError(
                400,
                f"{name} looks like a file path, which a server cannot read from a client: send the file's bytes as a "
                "data: URL (data:audio/wav;base64,...), or a file:// URL of a file on the server under "
                "--allowed-local-media-path",
            ) from None
        raise SpeechApiError(400, f"{name} is not base64 (nor a data:, http(s):// or file:// URL)") from None
    if not data:
        raise SpeechApiError(400, f"{name} is empty")
    return data


def to_speech_request(body: Any, voices: Any = None) -> Any:
    """A validated body (of :func:`speech_body_model`, after :func:`with_upstream_meaning`) as the generator's
    ``SpeechRequest``. Where there are uploaded voices (``voices``, a :class:`~..voices.voice_store.VoiceStore`:
    Base checkpoints, which have no preset speakers), ``voice`` names one: the request carries the name as
    ``uploaded_voice``, and the server reads the voice off its event loop
    (:meth:`..server.speech_service.SpeechService.resolve_voice`); nothing is read or fetched here."""
    from ..generation.speech import SpeechRequest

    generator = {name: getattr(body, name) for name in GENERATOR_FIELDS}
    uploaded = voices is not None and bool(body.voice)
    return SpeechRequest(
        max_new_tokens=body.max_new_tokens,
        text=body.input,
        speaker=None if uploaded else body.voice,
        language=body.language,
        instruct=body.instructions,
        ref_audio=decode_audio_field(body.ref_audio) if body.ref_audio else None,
        ref_text=body.ref_text,
        x_vector_only_mode=body.x_vector_only_mode,
        speaker_embedding=body.speaker_embedding,
        uploaded_voice=body.voice if uploaded else None,
        **generator,
    )
