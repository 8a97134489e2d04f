"""``WS /v1/audio/speech/stream``: the session (:mod:`.speech_socket`), text in pieces cut into segments
(:mod:`.speech_text`), a browser's API key offered as a subprotocol (:mod:`.socket_auth`)."""
