"""vLLM-Omni edge: Qwen3-TTS Code2Wav off the server and onto devices."""
