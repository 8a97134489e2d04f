"""A Base checkpoint's uploaded voices, kept on disk (:mod:`.voice_store`): storage only, no HTTP."""
