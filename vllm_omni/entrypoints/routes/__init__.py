"""What vLLM mounts: the endpoint plugin and its HTTP routes (:mod:`.edge_routes`), the voice upload
(:mod:`.voice_uploads`)."""
