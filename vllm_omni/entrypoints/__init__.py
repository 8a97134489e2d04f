"""The vLLM integration, the top layer (may import everything below): the talker's offline and streaming
API (``speech``); the serving entry point joins it."""
