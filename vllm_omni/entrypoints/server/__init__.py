"""One API server process: what its routes share and how it loads it (:mod:`.edge_state`), the speech it streams
(:mod:`.speech_streams`), its logs (:mod:`.server_logs`)."""
