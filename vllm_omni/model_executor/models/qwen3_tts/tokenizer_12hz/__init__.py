"""The Qwen3-TTS 12 Hz speech tokenizer's decoder (Code2Wav), in-tree."""

from .configuration_qwen3_tts_tokenizer_v2 import (
    OUTPUT_SAMPLE_RATE,
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from .errors import DecoderConfigError, DecoderWeightsError, InvalidCodesError
from .modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

__all__ = [
    "OUTPUT_SAMPLE_RATE",
    "DecoderConfigError",
    "DecoderWeightsError",
    "InvalidCodesError",
    "Qwen3TTSTokenizerV2Config",
    "Qwen3TTSTokenizerV2Decoder",
    "Qwen3TTSTokenizerV2DecoderConfig",
]
