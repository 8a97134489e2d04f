"""The body of ``POST /v1/audio/speech`` (and of the WebSocket's start message), and its speech request.

OpenAI's fields (``model``, ``input``, ``voice``, ``instructions``, ``response_format``), Qwen3-TTS's
(``language``, ``task_type``), the edge's (``edge_hardware``, ``stream``, ``frames_per_message``) and
the generator's own, under their :class:`~.speech.SpeechRequest` names (:data:`GENERATOR_FIELDS`).
"""

from __future__ import annotations

from typing import Any, Literal

CODEC_MEDIA_TYPE = "application/x-qwen3-tts-codec-stream"
TASK_TYPES = {"CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}

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


def speech_body_model() -> Any:
    """The pydantic model of the body: OpenAI's fields, Qwen3-TTS's, and the generator's."""
    import dataclasses
    import typing

    from pydantic import BaseModel, Field, create_model

    from .speech import SpeechRequest

    class OpenAISpeech(BaseModel):
        model: str | None = None
        input: str
        voice: str | None = None
        instructions: str | None = None
        language: str | None = None
        task_type: Literal["CustomVoice", "VoiceDesign"] | None = None
        response_format: Literal["codec", "pcm", "wav"] = "wav"
        edge_hardware: str | None = None
        stream: bool = False
        frames_per_message: int = Field(default=4, ge=1, le=256)

    hints = typing.get_type_hints(SpeechRequest)
    generator = {
        f.name: (hints[f.name], f.default) for f in dataclasses.fields(SpeechRequest) if f.name in GENERATOR_FIELDS
    }
    return create_model("SpeechBody", __base__=OpenAISpeech, **generator)


def to_speech_request(body: Any) -> Any:
    """A validated body (of :func:`speech_body_model`) as the generator's ``SpeechRequest``."""
    from .speech import SpeechRequest

    generator = {name: getattr(body, name) for name in GENERATOR_FIELDS}
    return SpeechRequest(
        text=body.input, speaker=body.voice, language=body.language, instruct=body.instructions, **generator
    )
