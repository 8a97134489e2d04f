"""Talking to a ``vllm serve --omni`` server: its plan URL, the API key, and a speech request's stream.

The plan and its artifacts come through the ordinary plan-URL download (``transport.fetch_plan``:
``GET /v1/edge/plans/CLASS/exec_plan.json`` and the files beside it, each sha256-checked). The
API key (``--api-key`` or ``VLLM_API_KEY``) is sent as a bearer token to that server only.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO

from ..errors import ClientError
from .transport import NETWORK_TIMEOUT_S, NetworkStream


class _BearerForServer(urllib.request.BaseHandler):
    """Adds ``Authorization: Bearer KEY`` to requests for one origin (scheme, host, port), no other."""

    def __init__(self, origin: tuple[str, str], key: str) -> None:
        self.origin, self.key = origin, key

    def http_request(self, request: urllib.request.Request) -> urllib.request.Request:
        url = urllib.parse.urlsplit(request.full_url)
        if (url.scheme, url.netloc) == self.origin:
            request.add_unredirected_header("Authorization", f"Bearer {self.key}")
        return request

    https_request = http_request


def use_api_key(server: str, key: str | None) -> None:
    """Send ``key`` with every request this process makes to ``server``."""
    if key:
        url = urllib.parse.urlsplit(server)
        urllib.request.install_opener(urllib.request.build_opener(_BearerForServer((url.scheme, url.netloc), key)))


def plan_url(server: str, hardware_class: str) -> str:
    return f"{server.rstrip('/')}/v1/edge/plans/{urllib.parse.quote(hardware_class)}/exec_plan.json"


def open_speech_stream(server: str, body: dict[str, Any], timeout: float = NETWORK_TIMEOUT_S) -> BinaryIO:
    """POST ``/v1/audio/speech`` with ``response_format: codec``; the response body is the codec stream.

    Every read waits at most ``timeout`` seconds; a cut or a stall is a typed error (``NetworkStream``).
    """
    request = urllib.request.Request(
        f"{server.rstrip('/')}/v1/audio/speech",
        data=json.dumps({**body, "response_format": "codec"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        message = _server_message(error)
        raise ClientError(f"the server refused the speech request (HTTP {error.code}): {message}") from None
    except TimeoutError:
        raise ClientError(f"no answer from {server} in {timeout:g} s (--timeout sets the limit)") from None
    except (OSError, http.client.HTTPException) as error:
        raise ClientError(f"cannot reach {server}: {type(error).__name__}: {error}") from None
    return NetworkStream(response, request.full_url, timeout)


def _server_message(error: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(error.read(65536) or b"{}")
    except ValueError:
        return error.reason or "no message"
    detail = payload.get("error", payload.get("detail", payload))
    return detail.get("message", str(detail)) if isinstance(detail, dict) else str(detail)
