"""The vLLM integration, the top layer (may import everything below), one folder per concern; imports point
down (pyproject.toml's contracts, docs/architecture.md):

* ``cli/``: the ``vllm serve ... --omni`` hand-off (builds or validates the plans before the API servers start);
* ``routes/``: the endpoint plugin and its HTTP routes (plans, artifacts, voices, speech);
* ``websocket/``: the speech WebSocket (text in pieces, a browser's key); ``browser/``: the browser page;
* ``server/``: what one API server process holds and makes (its shared state, the speech it streams, its logs);
* ``openai/``: the OpenAI speech API (body, limits, audio encodings, HTTP plumbing); ``plans/``: plans as API
  processes read them; ``voices/``: uploaded voices on disk;
* ``generation/``: the talker's offline and streaming API (``generation.speech``), beneath them all.
"""
