"""The speech tokenizer's encoder half as a checkpoint lays it out, stated without transformers.

The encoder (24 kHz audio -> codec frames) is transformers' Mimi: ``MimiModel`` less its decoder half
(``encoder`` SEANet convs, ``encoder_transformer``, the stride-2 ``downsample`` conv and the split
residual ``quantizer``). Its geometry is a ``MimiConfig`` stored as ``encoder_config`` in
``speech_tokenizer/config.json``; its tensors are ``encoder.<module path>`` in ``model.safetensors``.

This module states that layout with plain arithmetic, so code without transformers (the random-weight
checkpoint writer in the main venv) can write it and read its rates. The tests hold
:func:`encoder_state_shapes` equal to the state dict of the transformers modules and of the official
implementation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import EncoderConfigError

# The released encoder_config of every Qwen/Qwen3-TTS-12Hz-* speech tokenizer. Its values are those of
# MimiConfig's defaults (kyutai/mimi), down to the 32 quantizers of which the speech tokenizer keeps 16
# (``encoder_valid_num_quantizers``). Sources: public copies of the released config.json and the tensor list
# of its model.safetensors (``encoder.downsample.conv.weight`` [512, 512, 4], 32 codebooks of [2048, 256]).
RELEASED_ENCODER_CONFIG: dict[str, Any] = {
    "model_type": "mimi",
    "_frame_rate": 12.5,
    "sampling_rate": 24000,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "upsample_groups": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "initializer_range": 0.02,
    "norm_eps": 1e-05,
    "use_cache": False,
    "use_streaming": False,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "attention_dropout": 0.0,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}

# A small encoder for tests, at the rates of the small decoder (48 samples per frame at 24 kHz: SEANet strides
# 2*3*4, then the stride-2 downsample): every structural feature of the released one (residual blocks, a
# quantizer projection because the codebooks are narrower than the transformer, more quantizers than the 16
# kept, a sliding window shorter than test inputs) plus GQA and an explicit head_dim != hidden / heads.
SMALL_ENCODER_CONFIG: dict[str, Any] = {
    **RELEASED_ENCODER_CONFIG,
    "_frame_rate": 500.0,
    "hidden_size": 64,
    "num_filters": 8,
    "upsampling_ratios": [4, 3, 2],
    "codebook_dim": 32,
    "vector_quantization_hidden_dimension": 32,
    "num_quantizers": 20,
    "upsample_groups": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 250,
}

# Bounds checked before any module is built: far above the released sizes, far below what would exhaust
# memory building them. A config outside them is damaged, not a bigger model.
_SIZE_LIMITS = {
    "sampling_rate": 1 << 20,
    "audio_channels": 1,  # mono only: the speech tokenizer encodes one channel
    "hidden_size": 16384,
    "num_filters": 4096,
    "num_residual_layers": 16,
    "kernel_size": 64,
    "last_kernel_size": 64,
    "residual_kernel_size": 64,
    "dilation_growth_rate": 16,
    "compress": 64,
    "codebook_size": 1 << 16,
    "codebook_dim": 16384,
    "num_quantizers": 64,
    "vector_quantization_hidden_dimension": 16384,
    "num_semantic_quantizers": 63,
    "num_hidden_layers": 128,
    "intermediate_size": 65536,
    "num_attention_heads": 256,
    "num_key_value_heads": 256,
    "head_dim": 1024,
    "max_position_embeddings": 1 << 20,
}
_MAX_RATIOS, _MAX_RATIO = 8, 64


def _field(config: Mapping[str, Any], name: str) -> Any:
    return config.get(name, RELEASED_ENCODER_CONFIG.get(name))


def check_encoder_config(config: Mapping[str, Any]) -> None:
    """Raise :class:`EncoderConfigError` unless ``config`` is an ``encoder_config`` this package can build.

    Absent fields mean MimiConfig's defaults (the released values).
    """
    if not isinstance(config, Mapping):
        raise EncoderConfigError(f"encoder_config must be a JSON object, found {type(config).__name__}")
    if config.get("model_type", "mimi") != "mimi":
        raise EncoderConfigError(f"encoder_config.model_type must be 'mimi', found {config.get('model_type')!r}")
    for name, limit in _SIZE_LIMITS.items():
        value = _field(config, name)
        if name == "head_dim" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise EncoderConfigError(
                f"encoder_config.{name} must be an integer in 1..{limit}, found {value!r}. "
                "Fix the checkpoint's speech_tokenizer/config.json."
            )
    ratios = _field(config, "upsampling_ratios")
    if (
        not isinstance(ratios, list)
        or not 1 <= len(ratios) <= _MAX_RATIOS
        or not all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= _MAX_RATIO for r in ratios)
    ):
        raise EncoderConfigError(
            f"encoder_config.upsampling_ratios must be 1..{_MAX_RATIOS} integers in 1..{_MAX_RATIO}, found {ratios!r}"
        )
    if _field(config, "num_semantic_quantizers") >= _field(config, "num_quantizers"):
        raise EncoderConfigError(
            f"encoder_config.num_semantic_quantizers ({_field(config, 'num_semantic_quantizers')}) must be below "
            f"num_quantizers ({_field(config, 'num_quantizers')})"
        )
    if _field(config, "codebook_dim") != _field(config, "vector_quantization_hidden_dimension"):
        raise EncoderConfigError(
            "encoder_config.codebook_dim must equal vector_quantization_hidden_dimension (the codebooks live in the "
            f"projected space), found {_field(config, 'codebook_dim')} and "
            f"{_field(config, 'vector_quantization_hidden_dimension')}"
        )
    if _field(config, "use_causal_conv") is not True:
        raise EncoderConfigError("encoder_config.use_causal_conv must be true (every released encoder is causal)")
    if _downsample_stride(config) not in (1, 2):
        raise EncoderConfigError(
            f"encoder_config: the SEANet rate {_encodec_frame_rate(config)} Hz over the frame rate "
            f"{encoder_frame_rate(config)} Hz must be 1 or 2 (Mimi's downsample conv has stride 2)"
        )


def _encodec_frame_rate(config: Mapping[str, Any]) -> int:
    """Frames per second after the SEANet convs (MimiConfig.encodec_frame_rate)."""
    return math.ceil(_field(config, "sampling_rate") / math.prod(_field(config, "upsampling_ratios")))


def encoder_frame_rate(config: Mapping[str, Any]) -> float:
    """Codec frames per second (MimiConfig.frame_rate: the stored ``_frame_rate``, else computed)."""
    stored = config.get("_frame_rate", config.get("frame_rate"))
    if stored is not None:
        return float(stored)
    return _field(config, "sampling_rate") / (math.prod(_field(config, "upsampling_ratios")) * 2)


def _downsample_stride(config: Mapping[str, Any]) -> int:
    ratio = _encodec_frame_rate(config) / encoder_frame_rate(config)
    return int(ratio) if ratio == int(ratio) else 0


def encoder_samples_per_frame(config: Mapping[str, Any]) -> int:
    """Input samples per codec frame: the SEANet strides times the downsample stride (1920 released)."""
    return math.prod(_field(config, "upsampling_ratios")) * _downsample_stride(config)


def encoder_transformer_samples_per_frame(config: Mapping[str, Any]) -> int:
    """Input samples per encoder-transformer position (960 released: the transformer runs before the downsample)."""
    return math.prod(_field(config, "upsampling_ratios"))


def encoder_state_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{encoder-relative name: shape}`` of every tensor of the encoder half (checkpoint names less ``encoder.``).

    The module tree of ``MimiModel`` without ``upsample``, ``decoder_transformer`` and ``decoder``; the
    codebook buffers ``initialized``, ``cluster_usage`` and ``embed_sum`` are persistent, so they are tensors
    of the checkpoint too.
    """
    check_encoder_config(config)
    c = {name: _field(config, name) for name in RELEASED_ENCODER_CONFIG}
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name: str, out_channels: int, in_channels: int, kernel: int, bias: bool = True) -> None:
        shapes[f"{name}.conv.weight"] = (out_channels, in_channels, kernel)
        if bias:
            shapes[f"{name}.conv.bias"] = (out_channels,)

    conv("encoder.layers.0", c["num_filters"], c["audio_channels"], c["kernel_size"])
    index, scaling = 1, 1
    for ratio in reversed(c["upsampling_ratios"]):
        width = scaling * c["num_filters"]
        for _ in range(c["num_residual_layers"]):
            conv(f"encoder.layers.{index}.block.1", width // c["compress"], width, c["residual_kernel_size"])
            conv(f"encoder.layers.{index}.block.3", width, width // c["compress"], 1)
            if c["use_conv_shortcut"]:
                conv(f"encoder.layers.{index}.shortcut", width, width, 1)
            index += 1
        index += 1  # ELU
        conv(f"encoder.layers.{index}", width * 2, width, ratio * 2)
        index += 1
        scaling *= 2
    index += 1  # ELU
    conv(f"encoder.layers.{index}", c["hidden_size"], scaling * c["num_filters"], c["last_kernel_size"])

    hidden, head_dim = c["hidden_size"], c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
    for layer in range(c["num_hidden_layers"]):
        prefix = f"encoder_transformer.layers.{layer}"
        projections = {
            "q_proj": (c["num_attention_heads"] * head_dim, hidden),
            "k_proj": (c["num_key_value_heads"] * head_dim, hidden),
            "v_proj": (c["num_key_value_heads"] * head_dim, hidden),
            "o_proj": (hidden, c["num_attention_heads"] * head_dim),
        }
        for projection, shape in projections.items():
            shapes[f"{prefix}.self_attn.{projection}.weight"] = shape
            if c["attention_bias"]:
                shapes[f"{prefix}.self_attn.{projection}.bias"] = (shape[0],)
        shapes[f"{prefix}.mlp.fc1.weight"] = (c["intermediate_size"], hidden)
        shapes[f"{prefix}.mlp.fc2.weight"] = (hidden, c["intermediate_size"])
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[f"{prefix}.{norm}.weight"] = (hidden,)
            shapes[f"{prefix}.{norm}.bias"] = (hidden,)
        shapes[f"{prefix}.self_attn_layer_scale.scale"] = (hidden,)
        shapes[f"{prefix}.mlp_layer_scale.scale"] = (hidden,)

    if _downsample_stride(config) == 2:
        conv("downsample", hidden, hidden, 2 * int(_encodec_frame_rate(config) / encoder_frame_rate(config)), False)

    groups = {
        "semantic": c["num_semantic_quantizers"],
        "acoustic": c["num_quantizers"] - c["num_semantic_quantizers"],
    }
    for group, count in groups.items():
        prefix = f"quantizer.{group}_residual_vector_quantizer"
        for layer in range(count):
            shapes[f"{prefix}.layers.{layer}.codebook.initialized"] = (1,)
            shapes[f"{prefix}.layers.{layer}.codebook.cluster_usage"] = (c["codebook_size"],)
            shapes[f"{prefix}.layers.{layer}.codebook.embed_sum"] = (c["codebook_size"], c["codebook_dim"])
        if c["vector_quantization_hidden_dimension"] != hidden:
            shapes[f"{prefix}.input_proj.weight"] = (c["vector_quantization_hidden_dimension"], hidden, 1)
            shapes[f"{prefix}.output_proj.weight"] = (hidden, c["vector_quantization_hidden_dimension"], 1)
    return shapes
