"""OpenAI's speech API as the server reads it: the request body and its checks (:mod:`.speech_api`), what one client
may ask (:mod:`.speech_limits`), ``response_format`` encodings (:mod:`.speech_audio`), HTTP plumbing
(:mod:`.speech_http`)."""
