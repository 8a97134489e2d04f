import json

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2DecoderConfig
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.make_checkpoint import decoder_shapes, main, save_reproducibly


def test_writes_the_released_file_layout_marked_as_random_weights(small_checkpoint):
    assert (small_checkpoint / "config.json").is_file()
    config = json.loads((small_checkpoint / "speech_tokenizer" / "config.json").read_text())
    assert "RANDOM WEIGHTS" in config["note"]
    assert config["decoder_config"]["head_dim"] == 32
    assert config["decode_upsample_rate"] == 48
    assert not list(small_checkpoint.rglob("*.partial"))


def test_the_same_tensors_and_metadata_are_saved_as_the_same_bytes(tmp_path):
    # safetensors orders its metadata map by a per-map random hash: without the sorted rewrite, eight keys come
    # out in the same order in four saves about once in 40,000**3 runs. Plans are keyed by the file's sha256.
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(5, dtype=torch.int64)}
    metadata = {f"key{index}": "é" * index for index in range(8)}
    paths = [tmp_path / f"{index}.safetensors" for index in range(4)]
    for path in paths:
        save_reproducibly(tensors, path, metadata)
    assert len({path.read_bytes() for path in paths}) == 1
    with safe_open(paths[0], "pt") as handle:
        assert handle.metadata() == metadata
        assert torch.equal(handle.get_tensor("b"), tensors["b"]) and torch.equal(handle.get_tensor("a"), tensors["a"])


def test_every_parameter_is_non_trivial(small_checkpoint):
    tensors = load_file(small_checkpoint / "speech_tokenizer" / "model.safetensors")
    for name, tensor in tensors.items():
        if not name.startswith("decoder."):
            continue
        if tensor.numel() > 1:
            assert tensor.std() > 1e-3, f"{name} is constant"
        assert tensor.abs().max() > 1e-3, f"{name} is zero"
        if name.endswith(("norm.weight", ".scale", ".gamma", "cluster_usage")):
            # Not the identity/constant init: a missing scale or division by usage would show.
            assert tensor.std() > 0.01 and (tensor - 1).abs().mean() > 0.05, name
        if name.endswith((".alpha", ".beta")):
            assert tensor.abs().max() > 0.1, name


def test_random_weight_audio_is_not_saturated(small_decoder):
    with torch.no_grad():
        audio = small_decoder(random_codes(64))
    assert 0.01 < audio.pow(2).mean().sqrt() < 0.3
    assert (audio.abs() > 0.9).float().mean() < 1e-3


def test_released_layout_has_the_released_parameter_count():
    shapes = decoder_shapes(Qwen3TTSTokenizerV2DecoderConfig.released())
    count = sum(torch.Size(s).numel() for s in shapes.values())
    # 114.3 M, of which 2 x 131,072 are the encoder-side quantizer input projections.
    assert round(count / 1e5) == 1143


def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["--geometry", "small", "--seed", "3", "--out", str(tmp_path / "c")]) == 0
    assert "random weights" in capsys.readouterr().out
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    assert load_code2wav_decoder(tmp_path / "c").total_upsample == 48
