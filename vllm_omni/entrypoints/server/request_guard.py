"""What every request must show before any route sees it (an ASGI middleware the endpoint plugin adds).

* A ``Host`` this server answers to, on every HTTP request and WebSocket handshake (DNS rebinding:
  :class:`~.site_policy.SitePolicy`): otherwise 403, or a refused handshake.
* For a state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) and every WebSocket handshake, an
  ``Origin`` that may (none, the server's own, or ``--speech-allowed-origins``): otherwise 403.
* On the speech routes that read JSON, ``Content-Type: application/json`` (the voice upload also takes
  ``multipart/form-data``): a ``text/plain`` body is what a cross-site page can send without a preflight,
  so it is refused with 415.
* WebSocket messages bounded where their bytes arrive: at start-up (the lifespan event, before the server
  listens) uvicorn's per-connection settings of this process get ``ws_max_size`` = ``--speech-max-body-bytes``
  and per-message deflate off, so no message is inflated or held past the limit the session would refuse
  (uvicorn's defaults: 16 MiB, deflate on).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .site_policy import SitePolicy

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


def guard_settings(args: Any) -> dict[str, Any]:
    """:class:`RequestGuard`'s arguments from ``vllm serve``'s (``args``; validated at start-up already)."""
    from ..openai.speech_limits import SpeechLimits

    policy = SitePolicy.from_settings(
        getattr(args, "speech_allowed_origins", None),
        getattr(args, "speech_allowed_hosts", None),
        getattr(args, "host", None),
    )
    return {"policy": policy, "ws_max_size": SpeechLimits.from_args(args).max_body_bytes + WS_OVERHEAD_BYTES}


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


class RequestGuard:
    """Pure ASGI middleware: the checks of the module docstring, then the app."""

    def __init__(self, app: Any, policy: SitePolicy, ws_max_size: int) -> None:
        self.app, self.policy, self.ws_max_size = app, policy, ws_max_size

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            self.bound_websocket_messages(scope)
        elif kind in ("http", "websocket"):
            refusal = self.refusal(scope)
            if refusal is not None:
                status, message = refusal
                if kind == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": ""})  # before accept: a 403
                else:
                    await refuse(send, status, message)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict[str, Any]) -> tuple[int, str] | None:
        """``(status, message)`` for a request this server does not take, or None."""
        policy = self.policy
        host = header(scope, b"host")
        if not policy.host_allowed(host):
            return 403, (
                f"this server does not answer to the host {host!r} (it answers to {policy.describe_hosts()}): a page "
                "whose name resolves here is not this server's; an operator adds names with --speech-allowed-hosts"
            )
        method = scope.get("method", "GET")
        if scope["type"] == "websocket" or method in STATE_CHANGING:
            origin = header(scope, b"origin")
            if not policy.origin_allowed(origin, host):
                return 403, (
                    f"requests from pages of {origin!r} may not change this server's state or open its sessions; "
                    "an operator allows an origin with --speech-allowed-origins"
                )
        if scope["type"] == "http" and method in STATE_CHANGING:
            accepted = BODY_TYPES.get(scope["path"].removeprefix(scope.get("root_path", "")))
            given = media_type(header(scope, b"content-type"))
            if accepted is not None and given not in accepted:
                return 415, f"Content-Type {given or 'none'!r} is not read here: send {' or '.join(accepted)}"
        return None

    def bound_websocket_messages(self, scope: dict[str, Any]) -> None:
        server = getattr(getattr(scope.get("app"), "state", None), "server", None)
        config = getattr(server, "config", None)
        if config is None:  # not served by uvicorn through vLLM: nothing to set
            logger.warning("WebSocket message limits not set: no uvicorn server config on the app")
            return
        config.ws_max_size = self.ws_max_size
        config.ws_per_message_deflate = False


async def refuse(send: Any, status: int, message: str) -> None:
    """OpenAI's error body with ``status``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
