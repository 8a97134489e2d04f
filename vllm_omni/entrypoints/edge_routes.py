"""HTTP routes of ``vllm serve --omni``: plans, their artifacts, and speech as codec frames or PCM.

A vLLM endpoint plugin (``vllm.endpoint_plugins`` entry point ``vllm_omni_edge``, allow-listed by the
``--omni`` hand-off). vLLM's ``--api-key`` middleware guards every ``/v1`` route, these included.

* ``GET /v1/edge/hardware``: the classes served, each with its plan id.
* ``GET /v1/edge/plans/{class}`` (also ``.../exec_plan.json``): the plan, ``ETag`` = plan id.
* ``GET /v1/edge/plans/{class}/artifacts/{name}`` (also ``.../{class}/{name}``, the plan-relative URL
  the edge client derives): an artifact, by its name in the plan only; ``Range``, ``ETag`` =
  sha256, ``X-Content-SHA256``.
* ``POST /v1/audio/speech``: OpenAI-style speech (body: :mod:`.speech_api`). ``response_format``
  ``codec`` streams the codec-token wire protocol (``docs/serving/codec_stream.md``) for
  ``edge_hardware``'s plan as the talker makes frames; ``pcm`` / ``wav`` decode on the server with
  the exact stateful decoder (``stream`` true: chunked as decoded). Bodies: :mod:`.speech_streams`.
* ``WS /v1/audio/speech/stream``: the codec stream over a WebSocket, text in pieces (:mod:`.speech_socket`).

An API server process loads plans only (:mod:`.edge_state`); building them is the start-up
hand-off's job (:mod:`.cli.serve`), so no exporter, graph or builder module is imported here.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types (Request,
# WebSocket), imported inside build_router, from the live annotations.
import uuid
from typing import Any

from .edge_state import EdgeServingState, artifact_files, load_edge_state
from .speech_api import CODEC_MEDIA_TYPE, TASK_TYPES, speech_body_model, to_speech_request
from .speech_socket import SpeechSocket
from .speech_streams import codec_stream, pcm_stream, wav_header, with_wav_header


def error_response(status: int, message: str) -> Any:
    """OpenAI's error body: ``{"error": {"message", "code"}}``."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


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
            return error_response(
                400, f"invalid speech request: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}"
            )
        except ValueError:
            return error_response(400, "the request body is not JSON")
        expected = edge.generator.config.tts_model_type
        if body.task_type is not None and TASK_TYPES[body.task_type] != expected:
            return error_response(400, f"task_type {body.task_type} does not match the served model ({expected})")
        speech_request = to_speech_request(body)
        try:  # refuse bad requests before anything streams
            edge.generator.build_request(speech_request)
        except SpeechRequestError as error:
            return error_response(400, str(error))
        request_id = f"speech-{uuid.uuid4().hex}"
        if body.response_format == "codec":
            if body.edge_hardware is None:
                return error_response(
                    400, "response_format codec needs edge_hardware (GET /v1/edge/hardware lists them)"
                )
            plan = edge.plan(body.edge_hardware)
            stream = codec_stream(edge, plan, speech_request, request_id, body.frames_per_message)
            return StreamingResponse(stream, media_type=CODEC_MEDIA_TYPE, headers={"X-Plan-Id": plan.plan_id})
        pcm = pcm_stream(edge, speech_request, request_id)
        sample_rate = edge.plans.server_decoder.codec.sample_rate
        media = "audio/wav" if body.response_format == "wav" else "audio/pcm"
        if body.stream:
            chunks = with_wav_header(pcm, sample_rate) if body.response_format == "wav" else pcm
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


class EdgeEndpointPlugin:
    """The ``vllm.endpoint_plugins`` entry: attaches the routes, loads plans and the generator per API server."""

    name = "vllm_omni_edge"
    required_tasks = ("generate",)

    def attach_router(self, app) -> None:
        app.include_router(build_router())

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None:
            return
        state.omni_edge = await load_edge_state(engine_client, args)
