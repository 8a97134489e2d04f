"""HTTP routes of ``vllm serve --omni``: plans, their artifacts, voices, and speech as codec frames or audio.

A vLLM endpoint plugin (``vllm.endpoint_plugins`` entry point ``vllm_omni_edge``, allow-listed by the
``--omni`` hand-off). vLLM's ``--api-key`` middleware guards every ``/v1`` route, these included.

* ``GET|HEAD /v1/edge/hardware``: the classes served, each with its plan id.
* ``GET|HEAD /v1/edge/plans/{class}`` (also ``.../exec_plan.json``): the plan, ``ETag`` = plan id
  (``If-None-Match`` -> 304).
* ``GET|HEAD /v1/edge/plans/{class}/artifacts/{name}`` (also ``.../{class}/{name}``, the plan-relative URL
  the edge client derives): an artifact, by its name in the plan only; ``Range``, ``ETag`` = sha256
  (``If-None-Match`` -> 304), ``X-Content-SHA256``.
* ``GET /v1/audio/voices``: the checkpoint's voices; ``POST`` uploads a voice to clone (Base checkpoints,
  JSON or multipart: ``name``, ``audio``, ``ref_text``, ``x_vector_only_mode``, ``consent``), encoded once
  and kept on disk (:mod:`.voice_uploads`); ``DELETE /v1/audio/voices/{name}`` removes one (the store:
  :mod:`..voices.voice_store`).
* ``POST /v1/audio/speech``: OpenAI's speech (body: :mod:`..openai.speech_api`, limits:
  :mod:`..openai.speech_limits`). ``response_format`` ``codec`` streams the codec-token wire protocol
  (``docs/serving/codec_stream.md``) for ``edge_hardware``'s plan as the talker makes frames; ``mp3`` (the
  default, as OpenAI's), ``opus``, ``aac``, ``flac``, ``wav``, ``pcm`` decode on the server with the exact
  stateful decoder and encode (:mod:`..openai.speech_audio`); ``stream`` true sends them as decoded,
  ``stream_format`` ``sse`` as OpenAI's events. A response that is not streamed stops, and its engine request
  is aborted, when its client disconnects. Bodies: :mod:`..server.speech_streams`.
* ``WS /v1/audio/speech/stream``: the codec stream over a WebSocket, text in pieces
  (:mod:`..websocket.speech_socket`); accepted with the ``qwen3-tts-codec-stream`` subprotocol when offered,
  and a browser's API key may come as a ``bearer.`` subprotocol (:mod:`..websocket.socket_auth`).
* With ``--edge-hardware browser``: the browser page and its runtime at ``/edge/browser/``
  (:mod:`..browser.browser_page`).

The text-generation routes vLLM mounts (chat, completions, messages, responses, tokenize) answer 404 with
what to use instead: the talker generates codec frames, not text. So do vLLM's routes that would act outside the
paths ``--api-key`` guards (``/invocations``, elastic-EP scaling). Every request passes the request guard first
(:mod:`..server.request_guard`: the ``Host`` allow-list, the Origin rule, JSON bodies as JSON).

An API server process loads plans only (:mod:`..server.serving_state`); building them is the start-up
hand-off's job (:mod:`..cli.serve`), so no exporter, graph or builder module is imported here.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types (Request,
# WebSocket), imported inside build_router, from the live annotations.
import asyncio
import uuid

from vllm_omni.edge.stream import SOCKET_PATH
from vllm_omni.errors import RequestRefused

from ..browser.browser_page import BrowserPage, build_page_router
from ..openai.speech_api import (
    CODEC_MEDIA_TYPE,
    SSE_MEDIA_TYPE,
    SpeechApiError,
    parse_json,
    speech_body,
    speech_body_model,
    to_speech_request,
)
from ..openai.speech_http import (
    closing_response,
    collect_unless_disconnected,
    error_response,
    not_modified,
    read_body,
    retry_after,
    until_disconnected,
)
from ..server.in_flight import InFlight
from ..server.lifecycle import LIFECYCLE, watch
from ..server.request_guard import RequestGuard, guard_settings
from ..server.server_logs import quiet_known_noise
from ..server.serving_state import ServingState, load_serving_state
from ..server.speech_metrics import speech_metrics
from ..server.speech_streams import (
    audio_stream,
    codec_stream,
    public_error,
    sse_events,
    streamed,
    usage,
    usage_headers,
    whole_file,
)
from ..websocket.socket_auth import CODEC_SUBPROTOCOL
from ..websocket.socket_session import CLOSE_GOING_AWAY, CLOSE_NOT_READY, CLOSE_TRY_AGAIN_LATER
from ..websocket.speech_session import open_session
from .speech_batch import speech_batch_route
from .voice_uploads import read_voice_upload, save_voice

STATE_ATTRIBUTE = "omni_serving"  # app.state's attribute: this process's ServingState
IN_FLIGHT_ATTRIBUTE = "omni_in_flight"  # app.state's attribute: the request guard's InFlightBounds
# vLLM's text routes (prefixes): a talker makes codec frames, so each answers 404 saying what to use.
TEXT_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
    "/generative_scoring",
    "/inference/v1/generate",
)
# vLLM's routes that act outside the paths its --api-key guards (/v1, /v2, /inference, /cohere): SageMaker's
# /invocations runs the generation handlers, elastic-EP scaling reconfigures the engine. Each answers 404.
UNGUARDED_ROUTES = ("/invocations", "/scale_elastic_ep", "/is_scaling_elastic_ep")


def build_router():
    from fastapi import APIRouter, Request, WebSocket
    from fastapi.responses import FileResponse, JSONResponse, Response

    from ..openai.speech_audio import AUDIO_FORMATS

    router = APIRouter()
    speech_model = speech_body_model()

    def state(request: Request) -> ServingState:
        serving = getattr(request.app.state, STATE_ATTRIBUTE, None)
        if serving is None:
            raise SpeechApiError(503, "the speech routes are not initialised (the server was not started with --omni)")
        return serving

    @router.get("/v1/edge/hardware")
    @router.head("/v1/edge/hardware")
    async def hardware(request: Request):
        rows = [
            {"name": name, "plan_id": plan.plan_id, "graph_kind": plan.graph_kind, "backend": plan.backend}
            for name, plan in state(request).plans.published.items()
        ]
        return JSONResponse({"classes": rows})

    async def plan(request: Request, name: str):
        plans = state(request).plans
        plan = plans.plan(name)
        etag = f'"{plan.plan_id}"'
        if not_modified(request, etag):
            return Response(status_code=304, headers={"ETag": etag})
        speech_metrics().plan_downloads.labels(name, "plan").inc()
        return Response(plans.plan_bytes[name], media_type="application/json", headers={"ETag": etag})

    async def artifact(request: Request, name: str, artifact: str):
        plan = state(request).plans.plan(name)
        files = plan.files()
        if artifact not in files:  # nothing from the request reaches the filesystem unless the plan lists it
            raise SpeechApiError(404, f"{artifact!r} is not an artifact of the {name} plan; listed: {', '.join(files)}")
        sha256 = files[artifact].sha256
        headers = {"ETag": f'"{sha256}"', "X-Content-SHA256": sha256}
        if not_modified(request, headers["ETag"]):
            return Response(status_code=304, headers=headers)
        speech_metrics().plan_downloads.labels(name, "artifact").inc()
        return FileResponse(plan.directory / artifact, headers=headers, media_type="application/octet-stream")

    for path in ("/v1/edge/plans/{name}", "/v1/edge/plans/{name}/exec_plan.json"):
        router.add_api_route(path, plan, methods=["GET", "HEAD"])
    # {artifact:path}: a plan's file may lie in a subfolder of its directory (the plan schema allows it); only a
    # name the plan lists is ever opened, so a path from the request never reaches the filesystem by itself.
    for path in ("/v1/edge/plans/{name}/artifacts/{artifact:path}", "/v1/edge/plans/{name}/{artifact:path}"):
        router.add_api_route(path, artifact, methods=["GET", "HEAD"])

    @router.get("/v1/audio/voices")
    async def voices(request: Request):
        return JSONResponse(await state(request).speech.voice_list())

    @router.post("/v1/audio/voices")
    async def upload_voice(request: Request):
        speech = state(request).speech
        upload = await read_voice_upload(request, speech)
        done, stored = await until_disconnected(request, save_voice(upload, speech))  # a queued encoding is dropped
        if not done:  # the client left: nothing stored, nobody to answer
            return Response(status_code=499)
        return JSONResponse({"success": True, "voice": stored.describe()})

    @router.delete("/v1/audio/voices/{name}")
    async def delete_voice(request: Request, name: str):
        voices = state(request).voices
        await voices.files(voices.uploads().delete, name)
        return JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"})

    @router.post("/v1/audio/speech")
    async def speech(request: Request):
        serving = state(request)
        speech = serving.speech
        request_id = f"speech-{uuid.uuid4().hex}"
        data = parse_json(await read_body(request, speech.limits.max_body_bytes))
        meter = speech.meter("speech")  # the request is here: its first frame and audio are measured from now
        body = speech_body(speech_model, data, speech.limits, speech.served_models, speech.config)
        plan = serving.plans.plan(body.edge_hardware) if body.response_format == "codec" else None
        request_voice = to_speech_request(body, speech.voices.store)
        done, prepared = await until_disconnected(request, speech.prepare(request_voice, request_id))  # off the loop
        if not done:  # the client left while its voice or prompt waited: that work is dropped
            return Response(status_code=499)
        fmt = body.response_format
        if plan is not None:
            per_message, first = body.frames_per_message, body.first_frames
            stream = codec_stream(speech, plan, prepared, request_id, per_message, first, meter=meter)
            return closing_response(stream, CODEC_MEDIA_TYPE, {"X-Plan-Id": plan.plan_id})
        headers = {"X-Sample-Rate": str(speech.sample_rate)}
        if body.sse:
            events = sse_events(speech, prepared, request_id, fmt, body.speed, body.first_frames, meter=meter)
            return closing_response(events, SSE_MEDIA_TYPE, headers)
        counts: dict[str, int] = {}
        meter.whole = not body.streamed
        audio = audio_stream(speech, prepared, request_id, fmt, body.speed, counts, body.first_frames, meter=meter)
        if body.streamed:
            return closing_response(streamed(audio), AUDIO_FORMATS[fmt], headers)
        try:
            data = await collect_unless_disconnected(request, audio)
        except Exception as error:  # the engine or the decoder failed: our message, logged once
            return error_response(500, public_error(error))
        if data is None:  # the client left: nothing to answer, and the engine request is aborted
            return Response(status_code=499)
        headers |= usage_headers(usage(prepared, counts["frames"]))
        meter.delivered()
        return Response(whole_file(data, fmt, speech.sample_rate), media_type=AUDIO_FORMATS[fmt], headers=headers)

    def batch_slots(request: Request) -> InFlight:
        return getattr(request.app.state, IN_FLIGHT_ATTRIBUTE).responses

    batch = speech_batch_route(lambda request: state(request).speech, batch_slots, speech_model)
    router.add_api_route("/v1/audio/speech/batch", batch, methods=["POST"])

    @router.websocket(SOCKET_PATH)
    async def speech_socket(socket: WebSocket):
        serving = getattr(socket.app.state, STATE_ATTRIBUTE, None)
        gate = serving.sockets if serving is not None else None  # Host and Origin: checked by the request guard
        offered = socket.scope.get("subprotocols") or ()
        await socket.accept(subprotocol=CODEC_SUBPROTOCOL if CODEC_SUBPROTOCOL in offered else None)
        if gate is None:
            await socket.close(code=CLOSE_NOT_READY, reason="the speech routes are not initialised (start with --omni)")
            return
        if LIFECYCLE.draining:
            speech_metrics().refused("draining")
            await socket.close(code=CLOSE_GOING_AWAY, reason="the server is shutting down: open the session elsewhere")
            return
        if gate.open >= gate.max_open:
            speech_metrics().refused("sessions")
            await socket.close(
                code=CLOSE_TRY_AGAIN_LATER,
                reason=f"{gate.open} speech sessions are open, the most this server takes: try again later",
            )
            return
        gate.open += 1
        try:
            await open_session(serving, socket, speech_model)
        finally:
            gate.open -= 1

    async def text_route(request: Request):
        return error_response(
            404,
            f"{request.url.path} is not served: this model is the Qwen3-TTS talker, which makes speech, not "
            f"text; use POST /v1/audio/speech or the WebSocket {SOCKET_PATH}",
        )

    for prefix in TEXT_ROUTES:
        for path in (prefix, prefix + "/{rest:path}"):
            router.add_api_route(path, text_route, methods=["GET", "POST"], include_in_schema=False)

    async def unguarded_route(request: Request):
        return error_response(
            404,
            f"{request.url.path} is not served here: it would act outside the paths --api-key guards; use POST "
            f"/v1/audio/speech or the WebSocket {SOCKET_PATH}",
        )

    for path in UNGUARDED_ROUTES:
        router.add_api_route(path, unguarded_route, methods=["GET", "POST"], include_in_schema=False)

    return router


async def api_error(request, error):
    """A refusal raised by a route (a :class:`~vllm_omni.errors.RequestRefused`: the speech API's, the voice
    store's, the talker's): OpenAI's error body, counted by its status."""
    speech_metrics().refused(f"status_{getattr(error, 'status', 400)}")
    return error_response(getattr(error, "status", 400), str(error), retry_after(error))


def is_replaced_route(path: str) -> bool:
    """Whether ``path`` is one of vLLM's routes the plugin answers with 404 (text generation, unguarded work)."""
    return path in UNGUARDED_ROUTES or any(path == prefix or path.startswith(prefix + "/") for prefix in TEXT_ROUTES)


def without_replaced_routes(app) -> None:
    """Drop vLLM's text-generation and unguarded routes from ``app`` (the plugin's 404 answers replace them)."""
    app.router.routes[:] = [route for route in app.router.routes if not is_replaced_route(getattr(route, "path", ""))]


class EdgeEndpointPlugin:
    """The ``vllm.endpoint_plugins`` entry: attaches the routes, loads plans and the generator per API server."""

    name = "vllm_omni_edge"
    required_tasks = ("generate",)

    def attach_router(self, app) -> None:
        quiet_known_noise()
        without_replaced_routes(app)
        app.include_router(build_router())
        # vLLM's build_app sets app.state.args first; the hand-off checked the page's files already.
        if "browser" in getattr(getattr(app.state, "args", None), "edge_classes", ()):
            app.include_router(build_page_router(BrowserPage.find()))
        app.add_exception_handler(RequestRefused, api_error)
        settings = guard_settings(app.state.args)
        setattr(app.state, IN_FLIGHT_ATTRIBUTE, settings["in_flight"])  # the batch route counts its items there
        app.add_middleware(RequestGuard, **settings)

    async def init_state(self, engine_client, state, args) -> None:
        if engine_client is None:
            return
        serving = await load_serving_state(engine_client, args)
        bounds = getattr(state, IN_FLIGHT_ATTRIBUTE, None)
        if bounds is not None:  # the request guard's bound, sized from the engine now that it is known
            bounds.responses.limit = serving.speech.limits.max_responses
        serving.watch = asyncio.create_task(watch(engine_client))  # signals and the engine's health, for life
        setattr(state, STATE_ATTRIBUTE, serving)
