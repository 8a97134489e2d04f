"""Loading the Code2Wav decoder from a checkpoint directory or hub id."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_omni.edge.checkpoint import load_code2wav_decoder, read_decoder_tensors, resolve_speech_tokenizer
from vllm_omni.edge.errors import CheckpointError, CheckpointNotFoundError
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import DecoderConfigError
from vllm_omni.testing.codes import random_codes


@pytest.fixture
def checkpoint_copy(small_checkpoint, tmp_path):
    return shutil.copytree(small_checkpoint, tmp_path / "copy")


def rewrite_weights(checkpoint, edit) -> None:
    path = checkpoint / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_loads_in_eval_mode_with_snake_caches_and_requested_dtype(small_checkpoint):
    decoder = load_code2wav_decoder(small_checkpoint, dtype=torch.bfloat16)
    assert not decoder.training
    assert all(p.dtype == torch.bfloat16 for p in decoder.parameters())
    assert decoder.decoder[-2].alpha_exp is not None
    assert decoder(random_codes(3)).dtype == torch.bfloat16


def test_speech_tokenizer_dir_itself_is_accepted(small_checkpoint):
    by_root = load_code2wav_decoder(small_checkpoint)
    by_subdir = load_code2wav_decoder(small_checkpoint / "speech_tokenizer")
    codes = random_codes(4)
    with torch.no_grad():
        assert torch.equal(by_root(codes), by_subdir(codes))


def test_encoder_tensors_are_ignored_and_every_decoder_tensor_is_loaded(small_checkpoint):
    stored = load_file(small_checkpoint / "speech_tokenizer" / "model.safetensors")
    tensors, ignored = read_decoder_tensors(resolve_speech_tokenizer(small_checkpoint))
    assert sorted(ignored) == sorted(n for n in stored if n.startswith("encoder.")) and ignored
    state = load_code2wav_decoder(small_checkpoint).state_dict()
    assert set(state) == set(tensors) == {n.removeprefix("decoder.") for n in stored if n.startswith("decoder.")}
    assert all(torch.equal(state[name], tensors[name]) for name in tensors)


def test_missing_tensor_is_refused_by_name(checkpoint_copy):
    rewrite_weights(checkpoint_copy, lambda t: t.pop("decoder.pre_transformer.norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): decoder.pre_transformer.norm.weight"):
        load_code2wav_decoder(checkpoint_copy)


def test_unexpected_decoder_tensor_is_refused_by_name(checkpoint_copy):
    rewrite_weights(checkpoint_copy, lambda t: t.update({"decoder.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected 1 tensor\(s\): decoder.extra.weight"):
        load_code2wav_decoder(checkpoint_copy)


def test_misshapen_tensor_is_refused_with_expected_and_found_shapes(checkpoint_copy):
    rewrite_weights(checkpoint_copy, lambda t: t.update({"decoder.pre_conv.conv.weight": torch.zeros(96, 64, 2)}))
    with pytest.raises(
        CheckpointError, match=r"decoder.pre_conv.conv.weight: expected \[96, 64, 3\], found \[96, 64, 2\]"
    ):
        load_code2wav_decoder(checkpoint_copy)


def test_non_finite_weights_are_refused(checkpoint_copy):
    def poison(tensors):
        tensors["decoder.pre_conv.conv.bias"][0] = float("nan")

    rewrite_weights(checkpoint_copy, poison)
    with pytest.raises(CheckpointError, match="decoder.pre_conv.conv.bias has non-finite values"):
        load_code2wav_decoder(checkpoint_copy)


def test_corrupt_safetensors_is_a_checkpoint_error(checkpoint_copy):
    (checkpoint_copy / "speech_tokenizer" / "model.safetensors").write_bytes(b"\x10\x00garbage")
    with pytest.raises(CheckpointError, match="corrupt or not safetensors"):
        load_code2wav_decoder(checkpoint_copy)


def test_config_without_decoder_config_is_refused(checkpoint_copy):
    path = checkpoint_copy / "speech_tokenizer" / "config.json"
    values = json.loads(path.read_text())
    del values["decoder_config"]
    path.write_text(json.dumps(values))
    with pytest.raises(DecoderConfigError, match="no 'decoder_config'"):
        load_code2wav_decoder(checkpoint_copy)


def test_directory_without_speech_tokenizer_says_what_it_expected(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="expected speech_tokenizer/config.json and speech_tokenizer/model"):
        load_code2wav_decoder(tmp_path)


def test_nonexistent_path_is_not_mistaken_for_a_hub_id(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint directory at"):
        load_code2wav_decoder(tmp_path / "nope" / "deeper")


def test_hub_id_offline_names_the_id_and_how_to_pass_a_local_dir(tmp_path, repo_root):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    script = (
        "from vllm_omni.edge.checkpoint import load_code2wav_decoder\n"
        "from vllm_omni.edge.errors import CheckpointNotFoundError\n"
        "try:\n    load_code2wav_decoder('Qwen/Qwen3-TTS-12Hz-0.6B-Base')\n"
        "except CheckpointNotFoundError as exc:\n    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert "'Qwen/Qwen3-TTS-12Hz-0.6B-Base'" in result.stdout, result.stderr
    assert "--model /path/to/checkpoint" in result.stdout
