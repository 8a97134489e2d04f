"""Write the talker half of a random-weight Qwen3-TTS checkpoint (config, weights, tokenizer).

The released ``Qwen/Qwen3-TTS-12Hz-*-{CustomVoice,VoiceDesign,Base}`` directories hold, beside
``speech_tokenizer/``::

    config.json              Qwen3TTSConfig: talker_config (+ code_predictor_config), special ids;
                             Base: speaker_encoder_config too
    generation_config.json   sampling defaults of the official ``generate``
    model.safetensors        talker.* tensors (the talker LM, text/codec embeddings, code predictor);
                             Base: speaker_encoder.* too (the ECAPA-TDNN speaker encoder)
    tokenizer.json, vocab.json, merges.txt, tokenizer_config.json   the Qwen2 BPE text tokenizer

No weights can be downloaded here, so this writes that layout with RANDOM WEIGHTS. The codec ids
(pad/bos/eos/think...), the speaker and language ids are the released ones (they are what the
prompt builder must get right); the text tokenizer is a tiny byte-level BPE trained here with the
``tokenizers`` library on a fixed corpus, its special tokens placed after its vocabulary, and the
config's special text ids point at them.

Geometries (``TALKER_GEOMETRIES``): ``tiny`` (CI: hidden 128, 2 layers, head_dim 64 as vLLM's CPU
attention needs) and ``0.6b`` (the released 0.6B sizes, read from the public
``Qwen3-TTS-12Hz-0.6B-CustomVoice`` config: hidden 1024, 28 layers, 16/8 heads, head_dim 128,
intermediate 3072, text vocab 151,936 at width 2048; code predictor 1024 wide, 5 layers).

A Base checkpoint's speaker encoder has ``enc_dim`` = the talker's hidden size (its embedding takes the
place of a speaker's codec embedding). At ``0.6b`` it has the released sizes (the public
``Qwen3-TTS-12Hz-0.6B-Base`` config sets only ``enc_dim: 1024`` and ``sample_rate: 24000``, the rest are
the official class defaults: channels 512/512/512/512/1536, kernels 5/3/3/3/1, dilations 1/2/3/4/1,
attention 128, Res2Net scale 8, SE 128); ``tiny`` is 8x narrower (64/64/64/64/192, attention and SE 32).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_omni.edge.files import write_atomically, write_json_atomically
from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import OFFICIAL_GENERATION_DEFAULTS

RANDOM_WEIGHTS_NOTE = "RANDOM WEIGHTS written by vllm_omni.testing.talker_checkpoint; not a trained model"

# The released codec control ids, language ids and CustomVoice speakers (public configs of
# Qwen3-TTS-12Hz-*-CustomVoice; the same in the 0.6B and 1.7B checkpoints).
CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
LANGUAGE_IDS = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
    "sichuan_dialect": 2062,
    "beijing_dialect": 2074,
}
SPEAKER_IDS = {
    "vivian": 3065,
    "serena": 3066,
    "uncle_fu": 3010,
    "dylan": 2878,
    "eric": 2875,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
}
SPEAKER_DIALECTS: dict[str, str | bool] = {name: False for name in SPEAKER_IDS} | {
    "dylan": "beijing_dialect",
    "eric": "sichuan_dialect",
}
GENERATION_DEFAULTS = {**OFFICIAL_GENERATION_DEFAULTS, "max_new_tokens": 8192}  # as the released files

# Special text tokens, in the order they follow the BPE vocabulary.
SPECIAL_TOKENS = {
    "<|endoftext|>": None,
    "<|im_start|>": "im_start_token_id",
    "<|im_end|>": "im_end_token_id",
    "<|tts_pad|>": "tts_pad_token_id",
    "<|tts_text_bos|>": "tts_bos_token_id",
    "<|tts_text_eod|>": "tts_eos_token_id",
}
# Qwen2's pre-tokenization pattern (public in its tokenizer.json).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS = [
    "<|im_start|>assistant\n",
    "<|im_start|>user\n",
    "Hello. How are you today? The quick brown fox jumps over the lazy dog.",
    "She said she would be here by noon, and she was.",
    "Speak slowly, in a warm and friendly voice. Very happy.",
    "其实我真的有发现，我是一个特别善于观察别人情绪的人。",
    "用特别愤怒的语气说。今天天气很好。",
    "Guten Tag. Bonjour. Buenos días. こんにちは。안녕하세요.",
    "0123456789, numbers and punctuation: !?;:-()",
]


@dataclass(frozen=True)
class TalkerGeometry:
    """Sizes of a talker checkpoint (the rest of its config follows from the released layout)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    text_hidden_size: int
    text_vocab_size: int | None  # None: the tokenizer's size
    mrope_section: tuple[int, int, int]
    rope_theta: float
    predictor_hidden_size: int
    predictor_num_hidden_layers: int
    predictor_num_attention_heads: int
    predictor_num_key_value_heads: int
    predictor_head_dim: int
    predictor_intermediate_size: int
    tts_model_size: str
    bpe_vocab_size: int = 480
    # The Base checkpoint's speaker encoder (enc_dim is hidden_size); defaults: the released sizes.
    speaker_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    speaker_attention_channels: int = 128
    speaker_se_channels: int = 128


TALKER_GEOMETRIES = {
    "tiny": TalkerGeometry(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        text_hidden_size=96,
        text_vocab_size=None,
        mrope_section=(12, 10, 10),
        rope_theta=1_000_000.0,
        predictor_hidden_size=64,
        predictor_num_hidden_layers=2,
        predictor_num_attention_heads=2,
        predictor_num_key_value_heads=1,
        predictor_head_dim=32,
        predictor_intermediate_size=128,
        tts_model_size="1b7",
        speaker_channels=(64, 64, 64, 64, 192),
        speaker_attention_channels=32,
        speaker_se_channels=32,
    ),
    "0.6b": TalkerGeometry(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        text_hidden_size=2048,
        text_vocab_size=151_936,
        mrope_section=(24, 20, 20),
        rope_theta=1_000_000.0,
        predictor_hidden_size=1024,
        predictor_num_hidden_layers=5,
        predictor_num_attention_heads=16,
        predictor_num_key_value_heads=8,
        predictor_head_dim=128,
        predictor_intermediate_size=3072,
        tts_model_size="0b6",
    ),
}
CODEC_VOCAB_SIZE = 3072
CODEBOOK_SIZE = 2048
NUM_CODE_GROUPS = 16
# The official Qwen3TTSSpeakerEncoderConfig defaults, which released Base configs leave implicit.
SPEAKER_ENCODER_DEFAULTS: dict[str, Any] = {
    "mel_dim": 128,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
}


def build_text_tokenizer(vocab_size: int = 480) -> Any:
    """A tiny byte-level BPE in Qwen2's style, trained on a fixed corpus; specials follow the vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = [line.replace("<|im_start|>", "") for line in _CORPUS] * 8 + ["assistant\n"] * 64
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    role = tokenizer.encode("<|im_start|>assistant\n").ids
    if len(role) != 3:  # the official prompt builder slices input_ids[:, :3] as <|im_start|> assistant \n
        raise RuntimeError(f"the test tokenizer splits the role header into {len(role)} tokens, expected 3")
    return tokenizer


TALKER_MODEL_TYPES = ("custom_voice", "voice_design", "base")


def talker_config(
    geometry: TalkerGeometry, special_ids: dict[str, int], text_vocab_size: int, model_type: str = "custom_voice"
) -> dict[str, Any]:
    """The root ``config.json`` of a CustomVoice (preset speakers), VoiceDesign or Base (none) checkpoint."""
    speakers = dict(SPEAKER_IDS) if model_type == "custom_voice" else {}
    predictor = {
        "model_type": "qwen3_tts_talker_code_predictor",
        "vocab_size": CODEBOOK_SIZE,
        "hidden_size": geometry.predictor_hidden_size,
        "intermediate_size": geometry.predictor_intermediate_size,
        "num_hidden_layers": geometry.predictor_num_hidden_layers,
        "num_attention_heads": geometry.predictor_num_attention_heads,
        "num_key_value_heads": geometry.predictor_num_key_value_heads,
        "head_dim": geometry.predictor_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "rope_theta": geometry.rope_theta,
        "num_code_groups": NUM_CODE_GROUPS,
        "attention_bias": False,
        "use_sliding_window": False,
    }
    talker = {
        "model_type": "qwen3_tts_talker",
        "vocab_size": CODEC_VOCAB_SIZE,
        "hidden_size": geometry.hidden_size,
        "intermediate_size": geometry.intermediate_size,
        "num_hidden_layers": geometry.num_hidden_layers,
        "num_attention_heads": geometry.num_attention_heads,
        "num_key_value_heads": geometry.num_key_value_heads,
        "head_dim": geometry.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": geometry.rope_theta,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": list(geometry.mrope_section),
            "interleaved": True,
        },
        "attention_bias": False,
        "use_sliding_window": False,
        "num_code_groups": NUM_CODE_GROUPS,
        "text_hidden_size": geometry.text_hidden_size,
        "text_vocab_size": text_vocab_size,
        **CODEC_IDS,
        "codec_language_id": dict(LANGUAGE_IDS),
        "spk_id": speakers,
        "spk_is_dialect": {name: SPEAKER_DIALECTS[name] for name in speakers},
        "code_predictor_config": predictor,
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": geometry.tts_model_size,
        "tts_model_type": model_type,
        **special_ids,
        "talker_config": talker,
        "note": RANDOM_WEIGHTS_NOTE,
    }
    if model_type == "base":
        config["speaker_encoder_config"] = speaker_encoder_config(geometry)
    return config


def speaker_encoder_config(geometry: TalkerGeometry) -> dict[str, Any]:
    """A Base checkpoint's ``speaker_encoder_config``: as released (``enc_dim``, ``sample_rate``), plus the
    fields where ``geometry`` leaves the official defaults."""
    sizes = {
        **SPEAKER_ENCODER_DEFAULTS,
        "enc_channels": list(geometry.speaker_channels),
        "enc_attention_channels": geometry.speaker_attention_channels,
        "enc_se_channels": geometry.speaker_se_channels,
    }
    changed = {name: value for name, value in sizes.items() if value != SPEAKER_ENCODER_DEFAULTS[name]}
    return {"enc_dim": geometry.hidden_size, "sample_rate": 24000, **changed}


def speaker_encoder_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every ``speaker_encoder.*`` tensor of a Base checkpoint with this root config.

    The layout of the official ECAPA-TDNN: ``blocks.0`` (TDNN), ``blocks.1..`` (SE-Res2Net: ``tdnn1``,
    ``res2net_block.blocks.*``, ``tdnn2``, ``se_block.conv1/conv2``), ``mfa``, ``asp`` (``tdnn``, ``conv``), ``fc``.
    """
    values = {**SPEAKER_ENCODER_DEFAULTS, **config["speaker_encoder_config"]}
    channels, kernels = values["enc_channels"], values["enc_kernel_sizes"]
    scale, se, attention = values["enc_res2net_scale"], values["enc_se_channels"], values["enc_attention_channels"]
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name: str, out_channels: int, in_channels: int, kernel: int = 1) -> None:
        shapes[f"speaker_encoder.{name}.weight"] = (out_channels, in_channels, kernel)
        shapes[f"speaker_encoder.{name}.bias"] = (out_channels,)

    conv("blocks.0.conv", channels[0], values["mel_dim"], kernels[0])
    for index in range(1, len(channels) - 1):
        width, block = channels[index], f"blocks.{index}"
        conv(f"{block}.tdnn1.conv", width, channels[index - 1])
        for branch in range(scale - 1):
            conv(f"{block}.res2net_block.blocks.{branch}.conv", width // scale, width // scale, kernels[index])
        conv(f"{block}.tdnn2.conv", width, width)
        conv(f"{block}.se_block.conv1", se, width)
        conv(f"{block}.se_block.conv2", width, se)
    conv("mfa.conv", channels[-1], channels[-1], kernels[-1])
    conv("asp.tdnn.conv", attention, 3 * channels[-1])
    conv("asp.conv", channels[-1], attention)
    conv("fc", values["enc_dim"], 2 * channels[-1])
    return shapes


def random_speaker_encoder_state(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 convolution weights (unit variance over the fan-in) and biases of about 0.1,
    deterministic in ``seed``: embeddings come out O(1) (the log-mels going in are O(10)), so a 1e-4 bar
    is a relative one of about 1e-5."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith(".bias"):
            tensor = 0.1 * torch.randn(shape, generator=generator)
        else:
            tensor = torch.randn(shape, generator=generator) / math.sqrt(math.prod(shape[1:]))
        state[name] = tensor.float().contiguous()
    return state


def talker_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every ``talker.*`` tensor a checkpoint with this root config holds."""
    talker = config["talker_config"]
    predictor = talker["code_predictor_config"]
    hidden, p_hidden = talker["hidden_size"], predictor["hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "talker.model.codec_embedding.weight": (talker["vocab_size"], hidden),
        "talker.model.text_embedding.weight": (talker["text_vocab_size"], talker["text_hidden_size"]),
        "talker.model.norm.weight": (hidden,),
        "talker.text_projection.linear_fc1.weight": (talker["text_hidden_size"], talker["text_hidden_size"]),
        "talker.text_projection.linear_fc1.bias": (talker["text_hidden_size"],),
        "talker.text_projection.linear_fc2.weight": (hidden, talker["text_hidden_size"]),
        "talker.text_projection.linear_fc2.bias": (hidden,),
        "talker.codec_head.weight": (talker["vocab_size"], hidden),
        "talker.code_predictor.model.norm.weight": (p_hidden,),
    }
    shapes |= _decoder_layer_shapes("talker.model.layers", talker)
    shapes |= _decoder_layer_shapes("talker.code_predictor.model.layers", predictor)
    for group in range(predictor["num_code_groups"] - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{group}.weight"] = (predictor["vocab_size"], hidden)
        shapes[f"talker.code_predictor.lm_head.{group}.weight"] = (predictor["vocab_size"], p_hidden)
    if p_hidden != hidden:
        shapes["talker.code_predictor.small_to_mtp_projection.weight"] = (p_hidden, hidden)
        shapes["talker.code_predictor.small_to_mtp_projection.bias"] = (p_hidden,)
    return shapes


def _decoder_layer_shapes(prefix: str, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, head_dim, inter = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(config["num_hidden_layers"]):
        p = f"{prefix}.{layer}"
        shapes |= {
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
            f"{p}.self_attn.q_proj.weight": (q, hidden),
            f"{p}.self_attn.k_proj.weight": (kv, hidden),
            f"{p}.self_attn.v_proj.weight": (kv, hidden),
            f"{p}.self_attn.o_proj.weight": (hidden, q),
            f"{p}.self_attn.q_norm.weight": (head_dim,),
            f"{p}.self_attn.k_norm.weight": (head_dim,),
            f"{p}.mlp.gate_proj.weight": (inter, hidden),
            f"{p}.mlp.up_proj.weight": (inter, hidden),
            f"{p}.mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def random_talker_state(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 tensors for ``shapes``, deterministic in ``seed``, with O(1) activations.

    Norm weights are 1 +- 0.1 (never the identity), linear weights are fan-in scaled, embeddings
    unit-variance; the heads are scaled so that logits spread over a few units: greedy picks are
    well separated (top-2 gaps far above float32 noise) and sampling is not degenerate.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith(".bias"):
            tensor = 0.02 * torch.randn(shape, generator=generator)
        elif "embedding" in name:
            tensor = torch.randn(shape, generator=generator)
        else:
            gain = 3.0 if ("codec_head" in name or "lm_head" in name) else 1.0
            tensor = gain * torch.randn(shape, generator=generator) / math.sqrt(shape[-1])
        state[name] = tensor.float().contiguous()
    return state


def write_talker_files(out: Path, geometry: str = "tiny", seed: int = 0, model_type: str = "custom_voice") -> Path:
    """Write config.json, generation_config.json, model.safetensors and the tokenizer files into ``out``."""
    if model_type not in TALKER_MODEL_TYPES:
        raise ValueError(f"unknown talker model type {model_type!r}; known: {', '.join(TALKER_MODEL_TYPES)}")
    from safetensors.torch import save_file

    spec = TALKER_GEOMETRIES[geometry]
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_text_tokenizer(spec.bpe_vocab_size)
    special_ids = {field: tokenizer.token_to_id(token) for token, field in SPECIAL_TOKENS.items() if field}
    special_ids["assistant_token_id"] = tokenizer.token_to_id("assistant")
    text_vocab_size = spec.text_vocab_size or 64 * math.ceil(tokenizer.get_vocab_size() / 64)
    config = talker_config(spec, special_ids, text_vocab_size, model_type)
    config["random_weights"] = {"talker_geometry": geometry, "seed": seed, "model_type": model_type}

    state = random_talker_state(talker_shapes(config), seed=seed + 7)
    if model_type == "base":
        state |= random_speaker_encoder_state(speaker_encoder_shapes(config), seed=seed + 11)
    write_atomically(
        out / "model.safetensors", lambda path: save_file(state, str(path), metadata={"note": RANDOM_WEIGHTS_NOTE})
    )
    _write_tokenizer_files(out, tokenizer)
    write_json_atomically(out / "generation_config.json", GENERATION_DEFAULTS)
    write_json_atomically(out / "config.json", config)
    return out


def _write_tokenizer_files(out: Path, tokenizer: Any) -> None:
    """tokenizer.json (fast), plus vocab.json/merges.txt and tokenizer_config.json as Qwen2 ships them."""
    write_atomically(out / "tokenizer.json", lambda path: tokenizer.save(str(path)))
    model = json.loads(tokenizer.to_str())["model"]
    write_json_atomically(out / "vocab.json", model["vocab"])
    merges = ["#version: 0.2"] + [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    write_atomically(out / "merges.txt", lambda path: path.write_text("\n".join(merges) + "\n", encoding="utf-8"))
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "note": RANDOM_WEIGHTS_NOTE,
    }
    write_json_atomically(out / "tokenizer_config.json", tokenizer_config)
