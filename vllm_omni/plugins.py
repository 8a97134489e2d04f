"""vLLM plugin hooks (entry points in pyproject.toml), run by vLLM in every one of its processes."""

from __future__ import annotations

TALKER_ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
TALKER_MODEL = "vllm_omni.model_executor.models.qwen3_tts.modeling_qwen3_tts_talker:Qwen3TTSTalkerForCodecFrames"


def register() -> None:
    """``vllm.general_plugins``: the Qwen3-TTS config with transformers, the talker with vLLM's registry."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    AutoConfig.register(Qwen3TTSConfig.model_type, Qwen3TTSConfig, exist_ok=True)
    if TALKER_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(TALKER_ARCHITECTURE, TALKER_MODEL)
