"""HTTP routes of ``vllm serve --omni``: plans, their artifacts, and speech as codec frames or PCM.

A vLLM endpoint plugin (``vllm.endpoint_plugins`` entry point ``vllm_omni_edge``, allow-listed by the
``--omni`` hand-off). vLLM's ``--api-key`` middleware guards every ``/v1`` route, these included.

* ``GET /v1/edge/hardware``: the classes served, each with its plan id.
* ``GET /v1/edge/plans/{class}`` (also ``.../exec_plan.json``): the plan, ``ETag`` = plan id.
* ``GET /v1/edge/plans/{class}/artifacts/{name}`` (also ``.../{class}/{name}``, the plan-relative URL
  the edge client derives): an artifact, by its name in the plan only; ``Range``, ``ETag`` =
  sha256, ``X-Content-SHA256``.
* ``POST /v1/audio/speech``: OpenAI-style speech. ``response_format`` ``codec`` streams the
  codec-token wire protocol (``docs/serving/codec_stream.md``) for ``edge_hardware``'s plan as the
  talker makes frames; ``pcm`` / ``wav`` decode on the server with the exact stateful decoder
  (``stream`` true: chunked as decoded).
"""

import asyncio
import json
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

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


def speech_body_model():
    """The body of ``POST /v1/audio/speech``: OpenAI's fields, Qwen3-TTS's, and the generator's."""
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


@dataclass
class EdgeServingState:
    """What the routes share: the plans, their JSON bytes, the frame generator on the engine, and an open
    decoder of the server's CPU plan that keeps its session loaded (each request opens its own decoder
    on that shared session at no cost: the onnxruntime backend shares graphs by file)."""

    plans: Any  # ServedPlans
    plan_bytes: dict[str, bytes]
    generator: Any  # AsyncCodecFrameGenerator
    warm_decoder: Any = None

    def plan(self, name: str):
        from fastapi import HTTPException

        plan = self.plans.published.get(name)
        if plan is None:
            served = ", ".join(self.plans.published) or "none"
            raise HTTPException(404, f"hardware class {name!r} is not served here; served: {served}")
        return plan


def _error(status: int, message: str):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def artifact_files(plan) -> dict[str, tuple[str, int]]:
    """Every file a device downloads for ``plan``: name -> (sha256, size)."""
    files = {a.file: (a.sha256, a.size_bytes) for a in plan.artifacts.values()}
    files |= {
        a.source["file"]: (a.source["sha256"], a.source["size_bytes"]) for a in plan.artifacts.values() if a.source
    }
    return files


def build_router():
    from fastapi import APIRouter, HTTPException, Request, WebSocket
    from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

    router = APIRouter()
    speech_body = speech_body_model()

    def state(request: Request) -> EdgeServingState:
        edge = getattr(request.app.state, "omni_edge", None)
        if edge is None:
            raise HTTPException(503, "the edge routes are not initialised (the server was not started with --omni)")
        return edge

    @router.get("/v1/edge/hardware")
    async def hardware(request: Request):
        edge = state(request)
        rows = [
            {"name": name, "plan_id": plan.plan_id, "graph_kind": plan.graph_kind, "backend": plan.backend}
            for name, plan in edge.plans.published.items()
        ]
        return JSONResponse({"classes": rows})

    @router.get("/v1/edge/plans/{name}")
    @router.get("/v1/edge/plans/{name}/exec_plan.json")
    async def plan(request: Request, name: str):
        edge = state(request)
        plan = edge.plan(name)
        return Response(edge.plan_bytes[name], media_type="application/json", headers={"ETag": f'"{plan.plan_id}"'})

    async def artifact(request: Request, name: str, artifact: str):
        edge = state(request)
        plan = edge.plan(name)
        files = artifact_files(plan)
        if artifact not in files:  # nothing from the request reaches the filesystem unless the plan lists it
            raise HTTPException(404, f"{artifact!r} is not an artifact of the {name} plan; listed: {', '.join(files)}")
        sha256, _size = files[artifact]
        headers = {"ETag": f'"{sha256}"', "X-Content-SHA256": sha256}
        return FileResponse(plan.directory / artifact, headers=headers, media_type="application/octet-stream")

    router.add_api_route("/v1/edge/plans/{name}/artifacts/{artifact}", artifact, methods=["GET"])
    router.add_api_route("/v1/edge/plans/{name}/{artifact}", artifact, methods=["GET"])

    @router.post("/v1/audio/speech")
    async def speech(request: Request):
        from pydantic import ValidationError

        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

        edge = state(request)
        try:
            body = speech_body.model_validate(await request.json())
        except ValidationError as error:
            return _error(400, f"invalid speech request: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}")
        except ValueError:
            return _error(400, "the request body is not JSON")
        expected = edge.generator.config.tts_model_type
        if body.task_type is not None and TASK_TYPES[body.task_type] != expected:
            return _error(400, f"task_type {body.task_type} does not match the served model ({expected})")
        speech_request = to_speech_request(body)
        try:  # refuse bad requests before anything streams
            edge.generator.build_request(speech_request)
        except SpeechRequestError as error:
            return _error(400, str(error))
        request_id = f"speech-{uuid.uuid4().hex}"
        if body.response_format == "codec":
            if body.edge_hardware is None:
                return _error(400, "response_format codec needs edge_hardware (GET /v1/edge/hardware lists them)")
            plan = edge.plan(body.edge_hardware)
            stream = codec_stream(edge, plan, speech_request, request_id, body.frames_per_message)
            return StreamingResponse(stream, media_type=CODEC_MEDIA_TYPE, headers={"X-Plan-Id": plan.plan_id})
        pcm = pcm_stream(edge, speech_request, request_id)
        sample_rate = edge.plans.server_decoder.codec.sample_rate
        media = "audio/wav" if body.response_format == "wav" else "audio/pcm"
        if body.stream:
            chunks = _with_wav_header(pcm, sample_rate) if body.response_format == "wav" else pcm
            return StreamingResponse(chunks, media_type=media, headers={"X-Sample-Rate": str(sample_rate)})
        data = b"".join([chunk async for chunk in pcm])
        if body.response_format == "wav":
            data = wav_header(len(data), sample_rate) + data
        return Response(data, media_type=media, headers={"X-Sample-Rate": str(sample_rate)})

    @router.websocket("/v1/audio/speech/stream")
    async def speech_socket(socket: WebSocket):
        await socket.accept()
        await SpeechSocket(state_of_socket(socket), socket, speech_body).run()

    def state_of_socket(socket: WebSocket) -> EdgeServingState | None:
        return getattr(socket.app.state, "omni_edge", None)

    return router


# WebSocket close codes (4000-4999 are the application's): what went wrong with the client's messages.
CLOSE_BAD_MESSAGE = 4400
CLOSE_NOT_SERVED = 4404
CLOSE_NOT_READY = 4503


class SpeechSocket:
    """One ``/v1/audio/speech/stream`` connection: the codec stream over a WebSocket, text in pieces.

    Client -> server (JSON text messages): ``{"type": "start", ...}`` with the fields of
    ``POST /v1/audio/speech`` (``edge_hardware`` required, ``input`` optional); then any number of
    ``{"type": "text", "text": ...}``; then ``{"type": "end"}``, or ``{"type": "cancel"}`` at any time.
    Each text piece is one segment, generated as soon as the ones before it are done: speech starts
    with the first piece while later text is still arriving. Server -> client: the wire protocol's
    start message (text), frames messages (binary; each segment ends with a ``segment end`` flag,
    the stream with ``end of stream``) and done (text: ``complete``, ``cancelled`` or ``error``).
    A malformed message closes the socket with code 4400 and the reason, an unserved class with 4404.
    """

    def __init__(self, edge: EdgeServingState | None, socket, speech_body) -> None:
        self.edge, self.socket, self.speech_body = edge, socket, speech_body
        self.pieces: asyncio.Queue = asyncio.Queue()

    async def close(self, code: int, reason: str) -> None:
        await self.socket.close(code=code, reason=reason[:120])

    async def receive_json(self) -> dict | None:
        """The next client message as a dict, or None after closing the socket on a malformed one."""
        message = await self.socket.receive()
        if message["type"] == "websocket.disconnect":
            return {"type": "disconnect"}
        text = message.get("text")
        try:
            payload = json.loads(text) if text is not None else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            await self.close(CLOSE_BAD_MESSAGE, "expected a JSON text message with a string 'type'")
            return None
        return payload

    async def run(self) -> None:
        from pydantic import ValidationError

        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

        if self.edge is None:
            await self.close(CLOSE_NOT_READY, "the edge routes are not initialised (start the server with --omni)")
            return
        start = await self.receive_json()
        if start is None or start["type"] == "disconnect":
            return
        if start["type"] != "start":
            await self.close(CLOSE_BAD_MESSAGE, f"the first message must be type 'start', got {start['type']!r}")
            return
        fields = {k: v for k, v in start.items() if k != "type"}
        try:
            body = self.speech_body.model_validate({"input": "", **fields, "response_format": "codec"})
        except ValidationError as error:
            first = error.errors()[0]
            await self.close(CLOSE_BAD_MESSAGE, f"start: {'.'.join(map(str, first['loc']))}: {first['msg']}")
            return
        plan = self.edge.plans.published.get(body.edge_hardware or "")
        if plan is None:
            served = ", ".join(self.edge.plans.published)
            await self.close(CLOSE_NOT_SERVED, f"edge_hardware {body.edge_hardware!r} is not served; served: {served}")
            return
        if body.input:
            await self.pieces.put(body.input)
        try:  # refuse a bad voice/language up front, with a stand-in text when none came yet
            self.edge.generator.build_request(to_speech_request(body.model_copy(update={"input": body.input or "."})))
        except SpeechRequestError as error:
            await self.close(CLOSE_BAD_MESSAGE, str(error))
            return
        speaker = asyncio.create_task(self.speak(body, plan))
        try:
            await self.listen(speaker)
        finally:
            if not speaker.done():
                speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)

    async def listen(self, speaker: asyncio.Task) -> None:
        """Client messages until ``end``: text pieces are queued, ``cancel`` stops the speech now."""
        while not speaker.done():
            receive = asyncio.create_task(self.receive_json())
            done, _ = await asyncio.wait({receive, speaker}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                return
            message = receive.result()
            if message is None:
                speaker.cancel()
                return
            kind = message["type"]
            if kind == "text" and isinstance(message.get("text"), str) and message["text"].strip():
                await self.pieces.put(message["text"])
            elif kind == "end":
                await self.pieces.put(None)
                await speaker
                return
            elif kind in ("cancel", "disconnect"):
                speaker.cancel()
                if kind == "cancel":
                    await asyncio.gather(speaker, return_exceptions=True)
                    if self.encoder is not None:
                        await self.socket.send_text(self.encoder.done(reason="cancelled").decode())
                    await self.close(1000, "cancelled")
                return
            else:
                speaker.cancel()
                await self.close(CLOSE_BAD_MESSAGE, f"unexpected message type {kind!r} (text, end or cancel)")
                return

    encoder = None  # the stream's CodecStreamEncoder, once the start message is out

    async def speak(self, body, plan) -> None:
        """Segments in order: each text piece through the talker, frames out as they are made."""
        from vllm_omni.edge.stream import StreamStart
        from vllm_omni.edge.stream.encoder import CodecStreamEncoder

        encoder = self.encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=f"speech-{uuid.uuid4().hex}"))
        await self.socket.send_text(encoder.start().decode())
        empty = np.zeros((0, plan.codec.num_quantizers), dtype=np.int64)
        try:
            while (text := await self.pieces.get()) is not None:
                request = to_speech_request(body.model_copy(update={"input": text}))
                async for frames in self.edge.generator.stream(request, f"speech-{uuid.uuid4().hex}"):
                    for first in range(0, len(frames), body.frames_per_message):
                        await self.socket.send_bytes(encoder.frames(frames[first : first + body.frames_per_message]))
                await self.socket.send_bytes(encoder.frames(empty, segment_end=True))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the done message says what went wrong
            await self.socket.send_text(encoder.done(reason="error", error=f"{type(error).__name__}: {error}").decode())
            await self.close(1011, "speech failed")
            return
        await self.socket.send_bytes(encoder.frames(empty, end_of_stream=True))
        await self.socket.send_text(encoder.done().decode())
        await self.close(1000, "complete")


def to_speech_request(body):
    from .speech import SpeechRequest

    generator = {name: getattr(body, name) for name in GENERATOR_FIELDS}
    return SpeechRequest(
        text=body.input, speaker=body.voice, language=body.language, instruct=body.instructions, **generator
    )


async def codec_stream(
    edge: EdgeServingState, plan, request, request_id: str, per_message: int
) -> AsyncIterator[bytes]:
    """The wire protocol as an HTTP body: magic, start, frames messages as the talker makes frames, done."""
    from vllm_omni.edge.stream import StreamStart
    from vllm_omni.edge.stream.encoder import CodecStreamEncoder
    from vllm_omni.edge.stream.messages import KIND_BINARY, KIND_JSON, RECORDING_MAGIC
    from vllm_omni.edge.stream.recording import record

    encoder = CodecStreamEncoder(StreamStart.for_plan(plan, stream_id=request_id))
    yield RECORDING_MAGIC + record(KIND_JSON, encoder.start())
    try:
        async for frames in edge.generator.stream(request, request_id):
            for first in range(0, len(frames), per_message):
                yield record(KIND_BINARY, encoder.frames(frames[first : first + per_message]))
    except Exception as error:  # the stream says what went wrong; the client keeps the audio so far
        yield record(KIND_JSON, encoder.done(reason="error", error=f"{type(error).__name__}: {error}"))
        return
    empty = np.zeros((0, plan.codec.num_quantizers), dtype=np.int64)
    yield record(KIND_BINARY, encoder.frames(empty, end_of_stream=True))
    yield record(KIND_JSON, encoder.done())


async def pcm_stream(edge: EdgeServingState, request, request_id: str) -> AsyncIterator[bytes]:
    """s16le PCM decoded on the server with the exact stateful decoder, as frames arrive."""
    from vllm_omni.edge.audio import float_to_pcm16
    from vllm_omni.edge.runtime import open_decoder

    decoder = await asyncio.to_thread(open_decoder, edge.plans.server_decoder, check_sha256=False, prepack=True)
    async for frames in edge.generator.stream(request, request_id):
        audio = await asyncio.to_thread(decoder.feed, frames)
        if audio.size:
            yield float_to_pcm16(audio).tobytes()
    tail = await asyncio.to_thread(decoder.flush)
    if tail.size:
        yield float_to_pcm16(tail).tobytes()


def wav_header(data_bytes: int, sample_rate: int) -> bytes:
    """A 16-bit mono WAV header; ``data_bytes`` 0xFFFFFFFF - 36 marks a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF))
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


async def _with_wav_header(pcm: AsyncIterator[bytes], sample_rate: int) -> AsyncIterator[bytes]:
    yield wav_header(0xFFFFFFFF - 36, sample_rate)
    async for chunk in pcm:
        yield chunk


class EdgeEndpointPlugin:
    """The ``vllm.endpoint_plugins`` entry: attaches the routes, loads plans and the generator per API server."""

    name = "vllm_omni_edge"
    required_tasks = ("generate",)

    def attach_router(self, app) -> None:
        app.include_router(build_router())

    async def init_state(self, engine_client, state, args) -> None:
        from vllm_omni.edge.plan.model import PLAN_NAME
        from vllm_omni.edge.runtime import open_decoder

        from .edge_plans import load_served_plans
        from .speech import AsyncCodecFrameGenerator

        if engine_client is None:
            return
        model = getattr(args, "model_tag", None) or args.model
        plans = load_served_plans(getattr(args, "edge_classes", []), Path(args.edge_artifacts))
        plan_bytes = {name: (p.directory / PLAN_NAME).read_bytes() for name, p in plans.published.items()}
        generator = await asyncio.to_thread(AsyncCodecFrameGenerator.for_engine, engine_client, model)
        # A long-lived server: weights repacked once for faster steps (prepack), and kept loaded.
        warm = await asyncio.to_thread(open_decoder, plans.server_decoder, check_sha256=False, prepack=True)
        state.omni_edge = EdgeServingState(plans, plan_bytes, generator, warm)
