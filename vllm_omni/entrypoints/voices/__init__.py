"""A Base checkpoint's uploaded voices: kept on disk (:mod:`.voice_store`, storage only, no HTTP), and the voices
feature of an API server process (:mod:`.voice_service`: the store, its file work off the event loop)."""
