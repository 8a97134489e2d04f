"""Log records every ``vllm serve --omni`` would print that say nothing wrong about this server.

* vLLM's chat-template warm-up (``vllm.renderers.base``) fails with a traceback at every start: the
  talker's engine runs with ``skip_tokenizer_init`` (its prompts are ids built here), and the text routes
  that would render chat are replaced by 404 answers (:mod:`.edge_routes`).
* vLLM's Anthropic ``/v1/messages`` serving warns about the chat template's system-message ordering:
  that route is one of those replaced.
* uvicorn logs ``ASGI callable returned without completing handshake`` after vLLM's ``--api-key``
  middleware refuses a WebSocket with a 401 denial response: the client did get its 401 (uvicorn's
  websockets implementation marks the handshake complete only on accept or close). The speech socket
  itself always accepts first, so no other source of that line is hidden.

Only records whose message starts with these texts are dropped; everything else on those loggers passes.
"""

from __future__ import annotations

import logging

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


def quiet_known_noise() -> None:
    """Install the filters (once per process)."""
    for name, message in _DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.message == message for f in logger.filters):
            logger.addFilter(_DropMessage(message))
