"""``POST /v1/audio/speech/batch``: several utterances in one request, as upstream vLLM-Omni serves them.

The body is ``items`` (1 to ``--speech-max-batch-items``, each with its ``input`` and any field of
``POST /v1/audio/speech``) and defaults for every item at its top level (an item's own value wins; the
``response_format`` default is upstream's ``wav``). Each item is checked as a request of its own and spoken
whole (no streaming, no codec stream: the answer is JSON); the items run concurrently in the engine as far as
``--speech-max-responses`` leaves room (the batch counts as the items it runs at once: one on its own slot, more
only on slots free then), each bounded as a single request is, and a client that leaves aborts every one of them.
Items that give the same reference audio (a top-level ``ref_audio``: every item) share one encoding of the voice.
The answer is upstream's: ``{id, results: [{index, status: "success", audio_data (base64), media_type, usage} |
{index, status: "error", error}], total, succeeded, failed}``, 200 whatever the items' fates; a body that is not a
batch is a 400.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint's parameter type (Request) from the live
# annotation.
import asyncio
import base64
import dataclasses
import uuid
from typing import Any

from vllm_omni.errors import RequestRefused

from ..openai.speech_api import SpeechApiError, check_model, parse_json, speech_body, to_speech_request
from ..openai.speech_http import error_response, read_body, until_disconnected
from ..server.in_flight import BatchItems
from ..server.speech_service import SpeechService
from ..server.speech_streams import audio_stream, public_error, usage, whole_file

BATCH_DEFAULT_FORMAT = "wav"  # upstream's default here (OpenAI has no batch endpoint)


def item_bodies(data: Any, limit: int) -> list[dict[str, Any]]:
    """The batch's items as request bodies, the top-level defaults under each item's own values; a
    :class:`SpeechApiError` (400) for a body that is not a batch."""
    if not isinstance(data, dict):
        raise SpeechApiError(400, "a speech batch is one JSON object: items and shared defaults")
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise SpeechApiError(400, 'a speech batch needs "items": a list of 1 or more objects, each with its "input"')
    if len(items) > limit:
        raise SpeechApiError(
            400, f"the batch has {len(items)} items; this server takes at most {limit} (--speech-max-batch-items)"
        )
    defaults = {key: value for key, value in data.items() if key != "items" and value is not None}
    bodies = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise SpeechApiError(400, f"items[{index}] is {type(item).__name__}; each item is an object with its input")
        given = {key: value for key, value in item.items() if value is not None}
        bodies.append({"response_format": BATCH_DEFAULT_FORMAT, **defaults, **given})
    return bodies


def speech_batch_route(service: Any, slots: Any, speech_model: Any) -> Any:
    """The route's endpoint; ``service(request)`` is the process's :class:`SpeechService`, ``slots(request)`` its
    speech responses in flight (:class:`~..server.in_flight.InFlight`), which the items count against."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    from ..openai.speech_audio import AUDIO_FORMATS

    async def speech_batch(request: Request):
        speech: SpeechService = service(request)
        data = parse_json(await read_body(request, speech.limits.max_body_bytes))
        bodies = item_bodies(data, speech.limits.max_batch_items)
        model = data.get("model")
        check_model(model if isinstance(model, str) else None, speech.served_models)

        made: dict[tuple, asyncio.Future] = {}  # a cloned voice per reference: a batch default is one for all items

        async def with_voice(request: Any) -> Any:
            """``request`` with its cloned voice, encoded once for every item that gives the same reference."""
            if request.ref_audio is None and request.speaker_embedding is None:
                return request
            key = (request.ref_audio, request.ref_text, request.x_vector_only_mode)
            key += (tuple(request.speaker_embedding or ()),)
            if key not in made:
                made[key] = asyncio.ensure_future(speech.resolve_voice(request))
            voice = (await made[key]).voice
            return dataclasses.replace(request, voice=voice, ref_audio=None, speaker_embedding=None, ref_text=None)

        admitted = asyncio.Semaphore(max(1, speech.limits.queued_jobs_bound // 2))
        items = BatchItems(slots(request))  # at once: its own slot's item and those on free slots
        meters = []  # each item's: its audio leaves with the answer

        async def speak(index: int, fields: dict[str, Any]) -> dict[str, Any]:
            try:
                if fields.get("stream") or "stream_format" in fields or fields.get("response_format") == "codec":
                    raise SpeechApiError(
                        400,
                        "a batch answers whole audio files as JSON: stream, stream_format and codec are for "
                        "/v1/audio/speech",
                    )
                body = speech_body(speech_model, fields, speech.limits, speech.served_models, speech.config)
                request_id = f"speech-batch-{uuid.uuid4().hex}"
                async with items.slot():
                    async with admitted:  # a batch takes at most half the work queues: its items wait, never refused
                        voiced = await with_voice(to_speech_request(body, speech.voices.store))
                        prepared = await speech.prepare(voiced, request_id)
                    counts: dict[str, int] = {}
                    fmt = body.response_format
                    meter = speech.meter("batch", whole=True)  # the batch's answer leaves whole, at its end
                    meters.append(meter)
                    stream = audio_stream(
                        speech, prepared, request_id, fmt, body.speed, counts, body.first_frames, meter=meter
                    )
                    data = b"".join([chunk async for chunk in stream])
            except asyncio.CancelledError:
                raise
            except Exception as error:  # this item's refusal or failure; the others go on
                message = str(error) if isinstance(error, RequestRefused) else public_error(error)
                return {"index": index, "status": "error", "error": message}
            sample_rate = speech.sample_rate
            return {
                "index": index,
                "status": "success",
                "audio_data": base64.b64encode(whole_file(data, fmt, sample_rate)).decode("ascii"),
                "media_type": AUDIO_FORMATS[fmt],
                "usage": usage(prepared, counts["frames"]),
            }

        work = asyncio.gather(*(speak(index, fields) for index, fields in enumerate(bodies)))
        try:
            finished, results = await until_disconnected(request, work)
        except Exception as error:
            return error_response(500, public_error(error))
        if not finished:  # the client left: every item's engine request is aborted
            return Response(status_code=499)
        succeeded = sum(result["status"] == "success" for result in results)
        for meter in meters:
            meter.delivered()
        return JSONResponse(
            {
                "id": f"speech-batch-{uuid.uuid4().hex}",
                "results": results,
                "total": len(results),
                "succeeded": succeeded,
                "failed": len(results) - succeeded,
            }
        )

    return speech_batch
