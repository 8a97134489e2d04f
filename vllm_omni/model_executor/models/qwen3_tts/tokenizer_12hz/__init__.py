"""The Qwen3-TTS 12 Hz speech tokenizer in-tree: its decoder (Code2Wav) and its encoder (audio -> codes)."""

from .configuration_qwen3_tts_tokenizer_v2 import (
    OUTPUT_SAMPLE_RATE,
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from .encoder import SpeechTokenizerEncoder, load_speech_tokenizer_encoder
from .errors import (
    DecoderConfigError,
    DecoderWeightsError,
    EncoderConfigError,
    EncoderWeightsError,
    InvalidAudioError,
    InvalidCodesError,
)
from .modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

__all__ = [
    "OUTPUT_SAMPLE_RATE",
    "DecoderConfigError",
    "DecoderWeightsError",
    "EncoderConfigError",
    "EncoderWeightsError",
    "InvalidAudioError",
    "InvalidCodesError",
    "Qwen3TTSTokenizerV2Config",
    "Qwen3TTSTokenizerV2Decoder",
    "Qwen3TTSTokenizerV2DecoderConfig",
    "SpeechTokenizerEncoder",
    "load_speech_tokenizer_encoder",
]
