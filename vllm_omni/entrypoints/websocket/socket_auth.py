"""The API key of a browser's WebSocket: offered as a subprotocol, checked as ``Authorization: Bearer KEY``.

A page cannot set headers on ``new WebSocket(url, protocols)``; it can offer subprotocols. The browser page
opens ``/v1/audio/speech/stream`` with ``[CODEC_SUBPROTOCOL, "bearer." + base64url(KEY)]`` (padding optional).
:class:`SubprotocolBearerAuth`, an ASGI middleware outside vLLM's ``--api-key`` check (the start-up hand-off
adds it through vLLM's ``--middleware``, which wraps the app after that check), rewrites that handshake only:
the ``bearer.`` entry leaves the offered subprotocols (it is never echoed or seen by the route) and becomes
an ``Authorization`` header unless the handshake has one. vLLM's middleware then checks it like any key: a
wrong one is refused with 401. The route accepts with :data:`CODEC_SUBPROTOCOL` when it was offered
(browsers fail a handshake whose answer names none of the offered subprotocols).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from vllm_omni.edge.stream.messages import PROTOCOL, SOCKET_PATH

CODEC_SUBPROTOCOL = PROTOCOL  # the subprotocol is the codec stream's protocol name
BEARER_PREFIX = "bearer."
MIDDLEWARE = f"{__name__}.SubprotocolBearerAuth"  # as vLLM's --middleware names it


def key_from_subprotocol(value: str) -> str | None:
    """The key in ``bearer.<base64url(KEY)>``, or None when it is not valid base64url of UTF-8 text."""
    encoded = value[len(BEARER_PREFIX) :]
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def with_subprotocol_key(scope: dict[str, Any]) -> dict[str, Any]:
    """``scope`` of a WebSocket handshake with its ``bearer.`` subprotocols taken out, the first as the
    ``Authorization`` header when the handshake has none (an undecodable one adds nothing: a 401 follows)."""
    offered = list(scope.get("subprotocols") or ())
    bearers = [p for p in offered if p.startswith(BEARER_PREFIX)]
    if not bearers:
        return scope
    kept = [p for p in offered if not p.startswith(BEARER_PREFIX)]
    headers = [(name, value) for name, value in scope.get("headers", ()) if name.lower() != b"sec-websocket-protocol"]
    if kept:
        headers.append((b"sec-websocket-protocol", ", ".join(kept).encode("latin-1")))
    key = key_from_subprotocol(bearers[0])
    if key is not None and not any(name.lower() == b"authorization" for name, _ in headers):
        headers.append((b"authorization", b"Bearer " + key.encode()))
    return {**scope, "subprotocols": kept, "headers": headers}


class SubprotocolBearerAuth:
    """Pure ASGI middleware: :func:`with_subprotocol_key` on the handshake of :data:`SOCKET_PATH` only."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and scope["path"].removeprefix(scope.get("root_path", "")) == SOCKET_PATH:
            scope = with_subprotocol_key(scope)
        await self.app(scope, receive, send)
