"""Hostile configs and codes (issue 12): one typed error under EdgeError, before any allocation they size."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_omni.edge.errors import EdgeError
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    DecoderConfigError,
    DecoderWeightsError,
    InvalidCodesError,
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    modeling_qwen3_tts_tokenizer_v2 as modeling,
)
from vllm_omni.testing.codes import random_codes


def test_the_decoder_errors_are_edge_errors():
    for error in (DecoderConfigError, InvalidCodesError, DecoderWeightsError):
        assert issubclass(error, EdgeError) and issubclass(error, ValueError)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"hidden_size": -512}, "hidden_size must be between 1 and"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be between 1 and"),
        ({"num_attention_heads": 0, "head_dim": None}, "num_attention_heads must be between 1 and"),
        ({"hidden_size": 2, "num_attention_heads": 4, "head_dim": None}, "head_dim must be even and >= 2"),
        ({"decoder_dim": 10**9}, "decoder_dim must be between 1 and"),
        ({"num_hidden_layers": 10**6}, "num_hidden_layers must be between 1 and"),
        ({"upsample_rates": [4, 10**6]}, "upsample_rates must be at most"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number"),
        ({"codebook_dim": True}, "codebook_dim must be an integer"),
    ],
)
def test_nonsense_sizes_are_refused_before_any_module_is_built(override, message):
    values = {**Qwen3TTSTokenizerV2DecoderConfig.small().to_dict(), **override}
    with pytest.raises(DecoderConfigError, match=message):
        Qwen3TTSTokenizerV2DecoderConfig.from_dict(values)


def _config_file(tmp_path, text: bytes):
    path = tmp_path / "config.json"
    path.write_bytes(text)
    return path


def test_non_utf8_deeply_nested_or_huge_config_files_are_config_errors(tmp_path):
    good = Qwen3TTSTokenizerV2Config(Qwen3TTSTokenizerV2DecoderConfig.small(), decode_upsample_rate=48).to_dict()
    cases = {
        "latin1": json.dumps(good).replace('"silu"', '"s\u00eflu"').encode("latin-1"),
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "nested decoder_config": json.dumps(
            {**good, "decoder_config": {**good["decoder_config"], "x": json.loads("[" * 200 + "]" * 200)}}
        ).encode(),
        "huge": b" " * (2 << 20) + b"{}",
        "a list": b"[]",
    }
    for name, text in cases.items():
        with pytest.raises(DecoderConfigError):
            Qwen3TTSTokenizerV2Config.from_json_file(_config_file(tmp_path, text))
        assert name


def test_bad_sample_rates_in_the_tokenizer_config_are_config_errors():
    with pytest.raises(DecoderConfigError, match="output_sample_rate must be an integer"):
        Qwen3TTSTokenizerV2Config(Qwen3TTSTokenizerV2DecoderConfig.small(), output_sample_rate="24k")


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
def test_any_integer_dtype_decodes_like_int64(small_decoder, dtype):
    codes = random_codes(7, codebook_size=200)  # fits uint8 and int16
    with torch.inference_mode():
        assert torch.equal(small_decoder(codes.to(dtype)), small_decoder(codes))


def test_too_many_frames_are_refused_before_anything_is_allocated(small_decoder):
    limit = small_decoder.config.max_position_embeddings
    codes = torch.zeros(1, 16, 200_000, dtype=torch.int64)
    with pytest.raises(InvalidCodesError, match=f"200000 frames; a full decode takes at most {limit}"):
        small_decoder(codes)


def test_long_decodes_attend_in_blocks_and_equal_the_masked_attention(small_decoder, monkeypatch):
    codes = random_codes(300, seed=3)
    with torch.inference_mode():
        masked = small_decoder(codes)
        monkeypatch.setattr(modeling, "ATTENTION_BLOCK_FRAMES", 64)  # 300 frames: blocks of 64 queries
        blocked = small_decoder(codes)
    assert (masked - blocked).abs().max().item() < 1e-5
