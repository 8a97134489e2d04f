"""The encoder's layout and config checks, without transformers (the main venv writes checkpoints with them)."""

from __future__ import annotations

import pytest

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.encoder_layout import (
    RELEASED_ENCODER_CONFIG,
    SMALL_ENCODER_CONFIG,
    check_encoder_config,
    encoder_frame_rate,
    encoder_samples_per_frame,
    encoder_state_shapes,
    encoder_transformer_samples_per_frame,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.errors import EncoderConfigError


def test_rates_of_the_released_and_small_encoders():
    assert (encoder_frame_rate(RELEASED_ENCODER_CONFIG), encoder_samples_per_frame(RELEASED_ENCODER_CONFIG)) == (
        12.5,
        1920,
    )
    assert encoder_transformer_samples_per_frame(RELEASED_ENCODER_CONFIG) == 960
    assert (encoder_frame_rate(SMALL_ENCODER_CONFIG), encoder_samples_per_frame(SMALL_ENCODER_CONFIG)) == (500.0, 48)


def test_a_config_without_the_stored_frame_rate_computes_it():
    config = {k: v for k, v in RELEASED_ENCODER_CONFIG.items() if k != "_frame_rate"}
    assert encoder_frame_rate(config) == 12.5 and encoder_samples_per_frame(config) == 1920


def test_released_layout_has_32_codebooks_and_both_projections():
    shapes = encoder_state_shapes(RELEASED_ENCODER_CONFIG)
    codebooks = [n for n in shapes if n.endswith("codebook.embed_sum")]
    assert len(codebooks) == 32 and shapes[codebooks[0]] == (2048, 256)
    assert shapes["quantizer.semantic_residual_vector_quantizer.input_proj.weight"] == (256, 512, 1)
    assert shapes["quantizer.acoustic_residual_vector_quantizer.output_proj.weight"] == (512, 256, 1)
    assert shapes["encoder.layers.14.conv.weight"] == (512, 1024, 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "encodec"}, "model_type must be 'mimi'"),
        ({"hidden_size": 0}, r"hidden_size must be an integer in 1\.\.16384, found 0"),
        ({"num_hidden_layers": "8"}, "num_hidden_layers must be an integer"),
        ({"codebook_size": True}, "codebook_size must be an integer"),
        ({"audio_channels": 2}, r"audio_channels must be an integer in 1\.\.1"),
        ({"upsampling_ratios": [8, 0]}, "upsampling_ratios must be"),
        ({"upsampling_ratios": "8654"}, "upsampling_ratios must be"),
        ({"num_semantic_quantizers": 32}, "num_semantic_quantizers .* must be below num_quantizers"),
        ({"codebook_dim": 128}, "codebook_dim must equal vector_quantization_hidden_dimension"),
        ({"use_causal_conv": False}, "use_causal_conv must be true"),
        ({"_frame_rate": 6.25}, "must be 1 or 2"),
    ],
)
def test_impossible_configs_are_refused_before_anything_is_built(change, message):
    with pytest.raises(EncoderConfigError, match=message):
        encoder_state_shapes({**RELEASED_ENCODER_CONFIG, **change})


def test_a_config_that_is_not_an_object_is_refused():
    with pytest.raises(EncoderConfigError, match="must be a JSON object, found list"):
        check_encoder_config([])
