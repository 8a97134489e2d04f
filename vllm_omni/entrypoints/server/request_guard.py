"""What every request must show before any route sees it (an ASGI middleware the endpoint plugin adds; it runs
inside vLLM's CORS, ``--api-key`` and ``--middleware`` layers, which vLLM adds after the plugins: CORS answers
preflight ``OPTIONS`` requests itself, and a request without the key is refused before it gets here).

* A ``Host`` this server answers to, on every HTTP request and WebSocket handshake (DNS rebinding:
  :class:`~.site_policy.SitePolicy`): otherwise 403, or a refused handshake.
* For every request that carries an ``Origin`` (browsers send one on cross-origin reads, on state-changing
  requests and on every WebSocket handshake), one that may: the server's own, ``--speech-allowed-origins`` or
  vLLM's ``--allowed-origins`` (but its default ``*``); otherwise 403. vLLM's CORS answers ``*`` by default,
  which would let any page read a keyless server's answers (its voices and their transcripts, its plans).
* On the speech routes that read JSON, ``Content-Type: application/json`` (the voice upload also takes
  ``multipart/form-data``): a ``text/plain`` body is what a cross-site page can send without a preflight,
  so it is refused with 415.
* The HTTP speech responses and voice uploads of this process in flight bounded (``--speech-max-responses``,
  ``--speech-max-voice-uploads``: 503 with ``Retry-After`` past them, :mod:`.in_flight`), and each send of a
  speech response's body within :data:`SEND_DEADLINE_S`: a client that stops reading loses its response (its
  engine request is aborted) instead of holding a decoder and its audio; a streamed audio body that fails after
  its headers (:class:`~.speech_streams.StreamCut`) ends without its last chunk, so its client reads an error.
* While the server drains (SIGTERM or SIGINT: :mod:`.lifecycle`), ``GET /health`` answers 503 (readiness fails at
  once) and new speech requests and voice uploads are refused (503 with ``Retry-After``); what is in flight goes on.
* ``GET /metrics`` (vLLM's Prometheus exporter, outside the paths vLLM's ``--api-key`` guards) with the key when
  the server has one, unless ``--speech-open-metrics`` opens it for a scraper (401 otherwise).
* WebSocket messages bounded where their bytes arrive: at start-up (the lifespan event, before the server
  listens) uvicorn's per-connection settings of this process get ``ws_max_size`` = ``--speech-max-body-bytes``
  and per-message deflate off, so no message is inflated or held past the limit the session would refuse
  (uvicorn's defaults: 16 MiB, deflate on).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
from typing import Any

from vllm_omni.errors import RequestRefused

from ..openai.speech_http import error_body, retry_after
from .in_flight import InFlightBounds
from .lifecycle import LIFECYCLE, Lifecycle
from .site_policy import SitePolicy
from .speech_metrics import speech_metrics
from .speech_streams import StreamCut
from .work_queue import RETRY_AFTER_S

logger = logging.getLogger("vllm.omni.speech")

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON = "application/json"
MULTIPART = "multipart/form-data"
# The speech routes that read a body, and the media types each reads.
BODY_TYPES = {
    "/v1/audio/speech": (JSON,),
    "/v1/audio/speech/batch": (JSON,),
    "/v1/audio/voices": (JSON, MULTIPART),
}
WS_OVERHEAD_BYTES = 1024  # a frame's header and a JSON message's envelope, over the body limit
METRICS_PATH = "/metrics"
HEALTH_PATH = "/health"  # what a load balancer probes for readiness: 503 from the moment the server drains
SEND_DEADLINE_S = 30.0  # a client that reads nothing for this long while its response waits is let go


class ClientNotReading(Exception):
    """A response could not be sent for :data:`SEND_DEADLINE_S`: its client stopped reading."""


def found_in(error: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The exception of ``kinds`` that ``error`` is or wraps (in exception groups), or None."""
    if isinstance(error, kinds):
        return error
    for inner in getattr(error, "exceptions", ()):
        if (found := found_in(inner, kinds)) is not None:
            return found
    return None


def site_policy(args: Any) -> SitePolicy:
    """The site policy of ``vllm serve``'s arguments: ``--speech-allowed-origins`` and vLLM's ``--allowed-origins``
    (but ``*``), ``--speech-allowed-hosts``, ``--host``. Raises ``ValueError`` naming a wrong entry."""
    cors = [origin for origin in getattr(args, "allowed_origins", None) or () if origin.strip() not in ("*", "")]
    origins = ",".join(filter(None, [getattr(args, "speech_allowed_origins", None), *cors]))
    return SitePolicy.from_settings(origins, getattr(args, "speech_allowed_hosts", None), getattr(args, "host", None))


def guard_settings(args: Any) -> dict[str, Any]:
    """:class:`RequestGuard`'s arguments from ``vllm serve``'s (``args``; validated at start-up already)."""
    from ..openai.speech_limits import SpeechLimits

    limits = SpeechLimits.from_args(args)
    return {
        "policy": site_policy(args),
        "ws_max_size": limits.max_body_bytes + WS_OVERHEAD_BYTES,
        "in_flight": InFlightBounds.for_limits(limits),
        "metrics_keys": () if getattr(args, "speech_open_metrics", False) else api_keys(args),
    }


def api_keys(args: Any) -> tuple[str, ...]:
    """The keys vLLM's ``--api-key`` guard takes, as it reads them: ``--api-key`` (one or several), else
    ``VLLM_API_KEY``; none: a keyless server."""
    given = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
    return tuple(key for key in ([given] if isinstance(given, str) else given) if key)


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


class RequestGuard:
    """Pure ASGI middleware: the checks of the module docstring, then the app."""

    def __init__(
        self,
        app: Any,
        policy: SitePolicy,
        ws_max_size: int,
        in_flight: InFlightBounds,
        metrics_keys: tuple[str, ...] = (),
        lifecycle: Lifecycle = LIFECYCLE,
    ) -> None:
        self.app, self.policy, self.ws_max_size, self.lifecycle = app, policy, ws_max_size, lifecycle
        self.in_flight = in_flight  # also the batch route's (app.state): its items count against the same bound
        # GET /metrics needs one of these keys (none: open), kept as vLLM's guard keeps them: their sha256 digests
        self.metrics_key_digests = tuple(hashlib.sha256(key.encode()).digest() for key in metrics_keys)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            self.bound_websocket_messages(scope)
        elif kind in ("http", "websocket"):
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            refusal = self.refusal(scope, path)
            if refusal is not None:
                if kind == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": ""})  # before accept: a 403
                else:
                    await refuse(send, refusal)
                return
            bound = self.in_flight.bound(scope.get("method", "GET"), path) if kind == "http" else None
            if bound is not None:
                with bound.held():
                    if bound is self.in_flight.responses:
                        with speech_metrics().streams_open.track_inprogress():
                            await self.speech_response(scope, receive, send)
                    else:
                        await self.app(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def speech_response(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """A speech route's response, each of its sends within :data:`SEND_DEADLINE_S` (a stalled send ends the
        response: its body's generator is closed, its engine request aborted)."""

        async def send_in_time(message: dict[str, Any]) -> None:
            try:
                async with asyncio.timeout(SEND_DEADLINE_S):
                    await send(message)
            except TimeoutError:
                raise ClientNotReading(f"the client read nothing for {SEND_DEADLINE_S:g} s") from None

        try:
            await self.app(scope, receive, send_in_time)
        except Exception as error:  # a streamed body raises these through its task group, wrapped
            ended = found_in(error, (ClientNotReading, StreamCut))
            if ended is None:
                raise
            # The response ends here without its last chunk: the server closes the connection, and a client reads
            # a truncated body (a cut stream), or nothing more (a client that stopped reading).
            logger.info("speech response %s: %s", "cut" if isinstance(ended, StreamCut) else "abandoned", ended)

    def refusal(self, scope: dict[str, Any], path: str) -> RequestRefused | None:
        """The refusal of a request this server does not take (``path``: its route path), or None; each counted by
        its reason (:mod:`.speech_metrics`)."""
        found = self.refusal_and_reason(scope, path)
        if found is None:
            return None
        reason, refusal = found
        speech_metrics().refused(reason)
        return refusal

    def refusal_and_reason(self, scope: dict[str, Any], path: str) -> tuple[str, RequestRefused] | None:
        policy = self.policy
        host = header(scope, b"host")
        if not policy.host_allowed(host):
            return "host", RequestRefused(  # the names it does answer to are not listed: a rebound page could read them
                f"this server does not answer to the host {host!r}: a page whose name resolves here is not this "
                "server's; an operator adds names with --speech-allowed-hosts (IP addresses and localhost are served)",
                403,
            )
        origin = header(scope, b"origin")  # sent by browsers on cross-origin reads, writes and every handshake
        if not policy.origin_allowed(origin, host):
            return "origin", RequestRefused(
                f"pages of {origin!r} may not read from this server, change its state or open its sessions; an "
                "operator allows an origin with --speech-allowed-origins",
                403,
            )
        metrics = path.startswith(METRICS_PATH)  # vLLM mounts its exporter on ^/metrics.*
        if scope["type"] == "http" and metrics and self.metrics_key_digests and not self.keyed(scope):
            return "metrics_key", RequestRefused(
                "/metrics needs the server's API key (Authorization: Bearer KEY); an operator opens it to a scraper "
                "with --speech-open-metrics",
                401,
            )
        if scope["type"] == "http" and self.lifecycle.draining and path == HEALTH_PATH:
            return "draining", RequestRefused(
                "the server is shutting down: it finishes the speech in flight, then exits", 503
            )
        if scope["type"] == "http" and scope.get("method", "GET") in STATE_CHANGING:
            bound = self.in_flight.bound(scope["method"], path)
            if self.lifecycle.draining and bound is not None:
                return "draining", RequestRefused(
                    "the server is shutting down: send the request to another server", 503, RETRY_AFTER_S
                )
            accepted = BODY_TYPES.get(path)
            given = media_type(header(scope, b"content-type"))
            if accepted is not None and given not in accepted:
                return "media_type", RequestRefused(
                    f"Content-Type {given or 'none'!r} is not read here: send {' or '.join(accepted)}", 415
                )
            if bound is not None and (full := bound.refusal()) is not None:
                return bound.flag.removeprefix("--speech-max-").replace("-", "_"), full
        return None

    def keyed(self, scope: dict[str, Any]) -> bool:
        """Whether the request carries one of the server's API keys as vLLM's guard reads it (``Authorization:
        Bearer KEY``, the scheme in any case), compared in constant time."""
        scheme, _, given = (header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(given.encode()).digest()  # as vLLM compares: digests of one length
        return any(hmac.compare_digest(digest, key) for key in self.metrics_key_digests)

    def bound_websocket_messages(self, scope: dict[str, Any]) -> None:
        server = getattr(getattr(scope.get("app"), "state", None), "server", None)
        config = getattr(server, "config", None)
        if config is None:  # not served by uvicorn through vLLM: nothing to set
            logger.warning("WebSocket message limits not set: no uvicorn server config on the app")
            return
        config.ws_max_size = self.ws_max_size
        config.ws_per_message_deflate = False


async def refuse(send: Any, refusal: RequestRefused) -> None:
    """``refusal`` as OpenAI's error body (:func:`~..openai.speech_http.error_body`), with its ``Retry-After``."""
    body = json.dumps(error_body(refusal.status, str(refusal))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in retry_after(refusal).items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
