import json

import pytest

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    DecoderConfigError,
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2DecoderConfig,
)


def test_released_geometry_matches_the_published_numbers():
    config = Qwen3TTSTokenizerV2DecoderConfig.released()
    assert config.total_upsample == 1920
    assert config.head_dim == 64 != config.hidden_size // config.num_attention_heads
    assert (config.sliding_window, config.num_hidden_layers, config.codebook_dim) == (72, 8, 512)


def test_head_dim_defaults_to_hidden_over_heads_like_upstream():
    config = Qwen3TTSTokenizerV2DecoderConfig(codebook_dim=512, hidden_size=512, num_attention_heads=16)
    assert config.head_dim == 32


def test_config_json_round_trip_keeps_unknown_fields(tmp_path):
    values = Qwen3TTSTokenizerV2Config(decoder_config=Qwen3TTSTokenizerV2DecoderConfig.released()).to_dict()
    values["decoder_config"]["_name_or_path"] = "kept"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    config = Qwen3TTSTokenizerV2Config.from_json_file(path)
    assert config.decoder_config == Qwen3TTSTokenizerV2DecoderConfig.released()
    assert config.decoder_config.extra["_name_or_path"] == "kept"
    assert config.frame_rate == 12.5


def test_config_without_decoder_config_is_refused_with_the_keys_found(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"encoder_config": {}, "output_sample_rate": 24000}))
    with pytest.raises(DecoderConfigError, match="no 'decoder_config'.*encoder_config"):
        Qwen3TTSTokenizerV2Config.from_json_file(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"codebook_dim": None}, "codebook_dim is missing"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"hidden_act": "relu6"}, "hidden_act must be one of"),
        ({"hidden_size": "512"}, "hidden_size must be an integer, found '512'"),
        ({"upsample_rates": [8, "5"]}, "upsample_rates must be a list of integers"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "only default RoPE"),
        ({"decoder_dim": 1000}, "must be divisible by 2\\*\\*len\\(upsample_rates\\)"),
    ],
)
def test_impossible_geometry_is_refused_naming_the_field(override, message):
    values = Qwen3TTSTokenizerV2DecoderConfig.released().to_dict()
    values.update(override)
    with pytest.raises(DecoderConfigError, match=message):
        Qwen3TTSTokenizerV2DecoderConfig.from_dict(values)


def test_decode_upsample_rate_must_agree_with_the_rates():
    values = Qwen3TTSTokenizerV2Config(decoder_config=Qwen3TTSTokenizerV2DecoderConfig.released()).to_dict()
    values["decode_upsample_rate"] = 960
    with pytest.raises(DecoderConfigError, match="decode_upsample_rate is 960 but .* give 1920"):
        Qwen3TTSTokenizerV2Config.from_dict(values)


def test_malformed_json_is_a_config_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(DecoderConfigError, match="not valid JSON"):
        Qwen3TTSTokenizerV2Config.from_json_file(path)
