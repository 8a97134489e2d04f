"""The encoder half of the random-weight checkpoint: the released layout, non-trivial values, and a decoder half
that stays what it was before the encoder was written (plans and parity runs are keyed by its bytes)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2DecoderConfig
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.encoder_layout import (
    RELEASED_ENCODER_CONFIG,
    encoder_samples_per_frame,
    encoder_state_shapes,
)
from vllm_omni.testing.make_checkpoint import (
    PREPROCESSOR_CONFIG,
    decoder_shapes,
    encoder_config_for,
)
from vllm_omni.testing.random_weights import random_decoder_state

# The official Qwen3TTSTokenizerV2Encoder at the released geometry (MimiModel less its decoder half), counted in
# the oracle venv: 225 tensors, 56,234,304 values.
OFFICIAL_RELEASED_ENCODER = (225, 56_234_304)


def speech_tokenizer_tensors(checkpoint, prefix: str) -> dict[str, torch.Tensor]:
    tensors = load_file(checkpoint / "speech_tokenizer" / "model.safetensors")
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}


def test_the_encoder_half_has_the_layout_of_its_config(small_checkpoint):
    config = json.loads((small_checkpoint / "speech_tokenizer" / "config.json").read_text())
    encoder = speech_tokenizer_tensors(small_checkpoint, "encoder.")
    assert {name: tuple(t.shape) for name, t in encoder.items()} == encoder_state_shapes(config["encoder_config"])
    assert encoder_samples_per_frame(config["encoder_config"]) == config["encode_downsample_rate"] == 48
    assert config["encoder_valid_num_quantizers"] == config["decoder_config"]["num_quantizers"] == 16
    preprocessor = json.loads((small_checkpoint / "speech_tokenizer" / "preprocessor_config.json").read_text())
    assert preprocessor == PREPROCESSOR_CONFIG
    with safe_open(small_checkpoint / "speech_tokenizer" / "model.safetensors", framework="pt") as handle:
        assert handle.metadata()["format"] == "pt"  # transformers' from_pretrained refuses a file without it


def test_every_encoder_tensor_is_non_trivial(small_checkpoint):
    for name, tensor in speech_tokenizer_tensors(small_checkpoint, "encoder.").items():
        if name.endswith("codebook.initialized"):
            assert tensor.tolist() == [1.0], name
            continue
        assert tensor.std() > 1e-3 and tensor.abs().max() > 1e-3, f"{name} is constant"
        if name.endswith(("layernorm.weight", ".scale", "cluster_usage")):
            # Not the init (ones, 0.01): a missing scale or a missing division by the usage would show.
            assert (tensor - 1).abs().mean() > 0.05 and (tensor - 0.01).abs().mean() > 0.05, name


def test_the_decoder_half_does_not_depend_on_the_encoder(small_checkpoint):
    config = Qwen3TTSTokenizerV2DecoderConfig.small()
    expected = random_decoder_state(decoder_shapes(config), seed=0, num_quantizers=config.num_quantizers)
    decoder = speech_tokenizer_tensors(small_checkpoint, "decoder.")
    assert decoder.keys() == expected.keys()
    assert all(torch.equal(decoder[name], expected[name]) for name in expected)


def test_the_released_encoder_has_the_official_tensor_count():
    shapes = encoder_state_shapes(encoder_config_for(Qwen3TTSTokenizerV2DecoderConfig.released()))
    assert (len(shapes), sum(torch.Size(s).numel() for s in shapes.values())) == OFFICIAL_RELEASED_ENCODER
    assert shapes["downsample.conv.weight"] == (512, 512, 4)  # as in the released model.safetensors
    assert encoder_samples_per_frame(RELEASED_ENCODER_CONFIG) == 1920


def test_a_decoder_rate_without_an_encoder_geometry_is_refused():
    config = Qwen3TTSTokenizerV2DecoderConfig(codebook_dim=64, upsampling_ratios=(2,), upsample_rates=(5,))
    with pytest.raises(
        ValueError, match=r"no random-weight encoder geometry makes 10 samples per frame \(known: \[48, 1920\]\)"
    ):
        encoder_config_for(config)
