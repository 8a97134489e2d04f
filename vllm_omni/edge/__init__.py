"""Edge decoding of Qwen3-TTS codec frames: export, verify, describe and run Code2Wav on devices."""
