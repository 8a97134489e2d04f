"""vLLM integration: the talker's offline/streaming API (``speech``); the serving entry point joins it."""
