"""A browser's API key as a WebSocket subprotocol: the handshake scope the middleware hands to vLLM's check."""

from __future__ import annotations

import asyncio
import base64

from vllm_omni.entrypoints.websocket.socket_auth import (
    CODEC_SUBPROTOCOL,
    SOCKET_PATH,
    SubprotocolBearerAuth,
    key_from_subprotocol,
    with_subprotocol_key,
)

from ..serving import bearer


def handshake(subprotocols: list[str], headers: list[tuple[bytes, bytes]] = (), path: str = SOCKET_PATH) -> dict:
    offered = [(b"sec-websocket-protocol", ", ".join(subprotocols).encode())] if subprotocols else []
    return {"type": "websocket", "path": path, "subprotocols": subprotocols, "headers": [*headers, *offered]}


def test_the_key_becomes_the_authorization_header_and_leaves_the_subprotocols():
    key = "sk-test/key+with?odd=chars~"  # base64url of it holds '-' and '_'; the padding is dropped
    scope = with_subprotocol_key(handshake([CODEC_SUBPROTOCOL, bearer(key)], [(b"host", b"x")]))
    assert scope["subprotocols"] == [CODEC_SUBPROTOCOL]
    assert scope["headers"] == [
        (b"host", b"x"),
        (b"sec-websocket-protocol", CODEC_SUBPROTOCOL.encode()),
        (b"authorization", f"Bearer {key}".encode()),
    ]
    assert key_from_subprotocol(bearer(key)) == key
    assert key_from_subprotocol("bearer." + base64.urlsafe_b64encode(key.encode()).decode()) == key  # padded


def test_a_header_key_wins_and_a_bad_encoding_adds_nothing():
    given = [(b"authorization", b"Bearer from-header")]
    scope = with_subprotocol_key(handshake([CODEC_SUBPROTOCOL, bearer("from-subprotocol")], given))
    assert [v for n, v in scope["headers"] if n == b"authorization"] == [b"Bearer from-header"]
    for broken in ("bearer.!!!", "bearer.a", "bearer." + base64.urlsafe_b64encode(b"\xff\xfe").decode()):
        assert key_from_subprotocol(broken) is None
        scope = with_subprotocol_key(handshake([broken]))
        assert scope["subprotocols"] == [] and scope["headers"] == []  # refused by vLLM's check: no key


def test_only_the_speech_socket_handshake_is_rewritten():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)

    middleware = SubprotocolBearerAuth(app)
    offered = [CODEC_SUBPROTOCOL, bearer("k")]
    for scope in (
        handshake(offered),
        handshake(offered, path="/v1/other"),
        {"type": "http", "path": SOCKET_PATH, "headers": []},
    ):
        asyncio.run(middleware(scope, None, None))
    assert seen[0]["subprotocols"] == [CODEC_SUBPROTOCOL] and (b"authorization", b"Bearer k") in seen[0]["headers"]
    assert seen[1]["subprotocols"] == offered and not any(n == b"authorization" for n, _ in seen[1]["headers"])
    assert seen[2] == {"type": "http", "path": SOCKET_PATH, "headers": []}
    unchanged = handshake([CODEC_SUBPROTOCOL])
    assert with_subprotocol_key(unchanged) is unchanged
