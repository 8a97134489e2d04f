"""Qwen3-TTS model components."""
