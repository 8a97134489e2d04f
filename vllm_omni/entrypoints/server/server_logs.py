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

* While the server drains (SIGTERM, :mod:`.lifecycle`), vLLM's ``AsyncLLM output_handler failed.`` with the
  traceback of an ``EngineDeadError``: the drain stopped the engine on purpose once the speech in flight was done, and
  the handler reads the stopped engine once more. Outside a drain the record passes: there it means a dead engine.

Only records whose message starts with these texts are dropped; everything else on those loggers passes.

And records are changed: every uvicorn line (the access log, and the WebSocket lines on ``uvicorn.error``) of a
request whose query names a key (``?api_key=``, which no client of ours sends: the browser page takes its key from
the URL fragment) keeps the parameter's name and loses its value, so an old bookmark does not write a key into the
server's logs.
"""

from __future__ import annotations

import logging
import re

from .lifecycle import LIFECYCLE

KEY_IN_QUERY = re.compile(r"(?i)([?&](?:api[_-]?key|access_token|token|key)=)[^&#\s]*")

_DROPPED = {
    "vllm.renderers.base": "Chat template warmup failed",
    "vllm.entrypoints.anthropic.serving": "The chat template requires system-first ordering",
    "uvicorn.error": "ASGI callable returned without completing handshake.",
}


# Dropped only while the server drains.
_DROPPED_WHILE_DRAINING = {"vllm.v1.engine.async_llm": "AsyncLLM output_handler failed."}


class _DropMessage(logging.Filter):
    def __init__(self, message: str, while_draining: bool = False) -> None:
        super().__init__()
        self.message, self.while_draining = message, while_draining

    def filter(self, record: logging.LogRecord) -> bool:
        if self.while_draining and not LIFECYCLE.draining:
            return True
        return not (isinstance(record.msg, str) and record.msg.startswith(self.message))


class _RedactKeys(logging.Filter):
    """A record with key values in any URL query of its message or arguments replaced by ``REDACTED``: uvicorn's
    access line (``client, method, path, ...``) and its WebSocket lines on ``uvicorn.error`` (``client, path``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "=" in record.msg:
            record.msg = KEY_IN_QUERY.sub(r"\1REDACTED", record.msg)
        args = record.args
        if isinstance(args, tuple) and any(isinstance(arg, str) and "=" in arg for arg in args):
            record.args = tuple(KEY_IN_QUERY.sub(r"\1REDACTED", a) if isinstance(a, str) else a for a in args)
        return True


REDACTED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def quiet_known_noise() -> None:
    """Install the filters (once per process)."""
    for dropped, while_draining in ((_DROPPED, False), (_DROPPED_WHILE_DRAINING, True)):
        for name, message in dropped.items():
            logger = logging.getLogger(name)
            if not any(isinstance(f, _DropMessage) and f.message == message for f in logger.filters):
                logger.addFilter(_DropMessage(message, while_draining))
    for name in REDACTED_LOGGERS:  # a filter sees only its own logger's records, not those it propagates
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactKeys) for f in logger.filters):
            logger.addFilter(_RedactKeys())
