"""Log records every ``vllm serve --omni`` would print that say nothing wrong about this server.

* vLLM's chat-template warm-up (``vllm.renderers.base``) fails with a traceback at every start: the
  talker's engine runs with ``skip_tokenizer_init`` (its prompts are ids built here), and the text routes
  that would render chat are replaced by 404 answers (:mod:`..routes.edge_routes`).
* vLLM's Anthropic ``/v1/messages`` serving warns about the chat template's system-message ordering:
  that route is one of those replaced.
* uvicorn logs ``ASGI callable returned without completing handshake`` after vLLM's ``--api-key``
  middleware refuses a WebSocket with a 401 denial response: the client did get its 401 (uvicorn's
  websockets implementation marks the handshake complete only on accept or close). The speech socket
  accepts or closes every handshake it is given, so no other source of that line is hidden.

Only records whose message starts with these texts are dropped; everything else on those loggers passes.

And one record is changed: uvicorn's access log line of a request whose query names a key (``?api_key=``, which
no client of ours sends: the browser page takes its key from the URL fragment) keeps the parameter's name and
loses its value, so an old bookmark does not write a key into the server's logs.
"""

from __future__ import annotations

import logging
import re

KEY_IN_QUERY = re.compile(r"(?i)([?&](?:api[_-]?key|access_token|token|key)=)[^&#\s]*")

_DROPPED = {
    "vllm.renderers.base": "Chat template warmup failed",
    "vllm.entrypoints.anthropic.serving": "The chat template requires system-first ordering",
    "uvicorn.error": "ASGI callable returned without completing handshake.",
}


class _DropMessage(logging.Filter):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.message))


class _RedactKeys(logging.Filter):
    """uvicorn's access record (``client, method, path, version, status``) with key values in the path's query
    replaced by ``REDACTED``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "=" in args[2]:
            record.args = (*args[:2], KEY_IN_QUERY.sub(r"\1REDACTED", args[2]), *args[3:])
        return True


def quiet_known_noise() -> None:
    """Install the filters (once per process)."""
    for name, message in _DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.message == message for f in logger.filters):
            logger.addFilter(_DropMessage(message))
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _RedactKeys) for f in access.filters):
        access.addFilter(_RedactKeys())
