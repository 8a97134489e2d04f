"""The body of ``POST /v1/audio/speech`` (and of the WebSocket's start message), its checks, its request.

OpenAI's fields (``model``, ``input``, ``voice``, ``instructions``, ``response_format``, ``speed``,
``stream_format``), Qwen3-TTS's (``language``, ``task_type``), the edge's (``edge_hardware``,
``stream``, ``frames_per_message``) and the generator's own, under their :class:`~..generation.speech.SpeechRequest`
names (:data:`GENERATOR_FIELDS`). :func:`check_body` refuses what the server will not do before any
tokenization: each refusal is a :class:`SpeechApiError` with the HTTP status and a message of ours.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from .speech_limits import SpeechLimits

CODEC_MEDIA_TYPE = "application/x-qwen3-tts-codec-stream"
SSE_MEDIA_TYPE = "text/event-stream"
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design", "Base": "base"}
MAX_NAME_CHARS = 256  # voice, language, model, edge_hardware

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


class SpeechApiError(Exception):
    """A request the speech routes refuse: ``status`` (HTTP) and a message saying what to send instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def speech_body_model() -> Any:
    """The pydantic model of the body: OpenAI's fields, Qwen3-TTS's, and the generator's."""
    import dataclasses
    import typing

    from pydantic import BaseModel, ConfigDict, Field, create_model

    from ..generation.speech import SpeechRequest
    from .speech_audio import AUDIO_FORMATS

    class OpenAISpeech(BaseModel):
        model_config = ConfigDict(allow_inf_nan=False)  # JSON's NaN and Infinity are not numbers here

        model: str | None = None
        input: str
        voice: str | None = None
        instructions: str | None = None
        language: str | None = None
        task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None
        response_format: Literal[(*AUDIO_FORMATS, "codec")] = "mp3"  # OpenAI's default
        speed: float = 1.0
        stream_format: Literal["audio", "sse"] = "audio"
        edge_hardware: str | None = None
        stream: bool = False
        frames_per_message: int = Field(default=4, ge=1, le=256)
        # Voice cloning (Base checkpoints); `voice` may also name an uploaded voice (/v1/audio/voices).
        ref_audio: str | None = None  # base64, or a data URL (data:audio/wav;base64,...)
        ref_text: str | None = None
        x_vector_only_mode: bool = False
        speaker_embedding: list[float] | None = None

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


def check_body(body: Any, limits: SpeechLimits, served_models: tuple[str, ...], tts_model_type: str) -> None:
    """What :func:`speech_body_model` cannot check alone: the limits, the served model, the format's options."""
    from .speech_audio import AudioFormatError, check_speed

    check_text("input", body.input, limits.max_input_chars, "speech-max-input-chars")
    check_text("instructions", body.instructions, limits.max_instructions_chars, "speech-max-instructions-chars")
    check_text("ref_text", body.ref_text, limits.max_input_chars, "speech-max-input-chars")
    for name in ("voice", "language", "model", "edge_hardware"):
        check_text(name, getattr(body, name), MAX_NAME_CHARS)
    if body.model is not None and body.model not in served_models:
        raise SpeechApiError(404, f"model {body.model!r} is not served here; served: {', '.join(served_models)}")
    if body.task_type is not None and TASK_TYPES[body.task_type] != tts_model_type:
        raise SpeechApiError(400, f"task_type {body.task_type} does not match the served model ({tts_model_type})")
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


def decode_audio_field(value: str, name: str = "ref_audio") -> bytes:
    """The bytes of an audio file sent as base64 or as a ``data:`` URL; remote URLs are not fetched."""
    import base64
    import binascii

    text = value.strip()
    if "://" in text[:16] or text.startswith("file:"):
        raise SpeechApiError(
            400, f"{name}: this server does not fetch URLs (no allow-list); send the audio as base64 or a data: URL"
        )
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise SpeechApiError(400, f"{name}: a data URL must be base64 (data:audio/wav;base64,...)")
    try:  # line breaks and spaces (the base64 command wraps at 76 columns) are not data
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise SpeechApiError(400, f"{name} is not base64 (nor a base64 data: URL)") from None
    if not data:
        raise SpeechApiError(400, f"{name} is empty")
    return data


def to_speech_request(body: Any, voices: Any = None) -> Any:
    """A validated body (of :func:`speech_body_model`) as the generator's ``SpeechRequest``. Where there are
    uploaded voices (``voices``, a :class:`~..voices.voice_store.VoiceStore`: Base checkpoints, which have no preset
    speakers), ``voice`` names one: the request carries the name as ``uploaded_voice``, and the server reads
    the voice off its event loop (:meth:`..server.edge_state.EdgeServingState.resolve_voice`); nothing is read here."""
    from ..generation.speech import SpeechRequest

    generator = {name: getattr(body, name) for name in GENERATOR_FIELDS}
    uploaded = voices is not None and bool(body.voice)
    return SpeechRequest(
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
