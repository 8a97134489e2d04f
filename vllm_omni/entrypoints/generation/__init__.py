"""The talker's offline and streaming front on vLLM's engine: codec frames from text (:mod:`.speech`), text that
arrives while it is spoken (:mod:`.streamed_text`), a client's reference audio decoded (:mod:`.reference_decoding`).
Nothing here knows HTTP."""
