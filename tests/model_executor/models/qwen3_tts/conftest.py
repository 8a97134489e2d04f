"""Fixtures of the decoder's model tests."""

import pytest

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2DecoderConfig


@pytest.fixture(scope="session")
def odd_geometry() -> Qwen3TTSTokenizerV2DecoderConfig:
    """Odd on purpose: no GQA, no ConvNeXt upsampling stage at all, GELU MLP, three decoder layers."""
    return Qwen3TTSTokenizerV2DecoderConfig(
        codebook_size=512,
        codebook_dim=32,
        num_quantizers=4,
        hidden_size=48,
        head_dim=16,
        num_attention_heads=3,
        num_key_value_heads=3,
        intermediate_size=64,
        num_hidden_layers=3,
        sliding_window=5,
        hidden_act="gelu",
        latent_dim=40,
        decoder_dim=32,
        upsampling_ratios=(),
        upsample_rates=(5, 2),
    )
