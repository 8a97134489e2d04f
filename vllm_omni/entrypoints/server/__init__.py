"""One API server process: its features and how it loads them (:mod:`.serving_state`), the speech feature
(:mod:`.speech_service`), the speech it streams (:mod:`.speech_streams`), its logs (:mod:`.server_logs`)."""
