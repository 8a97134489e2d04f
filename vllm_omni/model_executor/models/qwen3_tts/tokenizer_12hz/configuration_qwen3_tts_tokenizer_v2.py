"""Configuration of the Qwen3-TTS 12 Hz speech tokenizer (the "V2" tokenizer) and its decoder.

A released checkpoint keeps this configuration in ``speech_tokenizer/config.json``, with the
decoder geometry nested under ``decoder_config``. Read the geometry from that file: the field
defaults below mirror the official implementation's class defaults (so a file that omits a field
means what it means upstream), and those defaults are *not* the released sizes (see
:meth:`Qwen3TTSTokenizerV2DecoderConfig.released`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.json_limits import json_depth

from .errors import DecoderConfigError

SUPPORTED_ACTIVATIONS = ("silu", "gelu")
# Upper bounds on the geometry, checked before any module is built: far above every released size
# (released: widths <= 1536, 8 layers, 16 heads, 2048 codes), far below what would exhaust memory
# building the modules. A config outside them is damaged or hostile, not a bigger model.
MAX_WIDTH = 16384
SIZE_LIMITS = {
    "codebook_size": 1 << 16,
    "codebook_dim": MAX_WIDTH,
    "num_quantizers": 64,
    "hidden_size": MAX_WIDTH,
    "head_dim": 1024,
    "num_attention_heads": 256,
    "num_key_value_heads": 256,
    "intermediate_size": 4 * MAX_WIDTH,
    "num_hidden_layers": 128,
    "sliding_window": 1 << 16,
    "max_position_embeddings": 1 << 20,
    "latent_dim": MAX_WIDTH,
    "decoder_dim": MAX_WIDTH,
}
MAX_UPSAMPLE_STAGES = 8
MAX_UPSAMPLE_RATE = 64
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32
OUTPUT_SAMPLE_RATE = 24000  # Hz, of every released 12 Hz speech tokenizer


@dataclass(frozen=True)
class Qwen3TTSTokenizerV2DecoderConfig:
    """Geometry of the Code2Wav decoder (codec frames -> waveform).

    Fields:
        codebook_size: entries per codebook; valid codes are ``0 .. codebook_size - 1``.
        codebook_dim: width of the quantizer output; codebook vectors are ``codebook_dim // 2`` wide.
        num_quantizers: codebooks per frame (1 semantic + the rest acoustic).
        hidden_size: width of the pre-transformer.
        head_dim: attention head width. Explicit in released configs (64, not hidden/heads = 32);
            when absent, ``hidden_size // num_attention_heads`` as upstream.
        num_attention_heads / num_key_value_heads: query heads and key/value heads (GQA when fewer).
        intermediate_size: SwiGLU width of the transformer MLP.
        num_hidden_layers: transformer layers.
        sliding_window: causal attention window; each frame sees itself and ``sliding_window - 1``
            frames back.
        rope_theta: RoPE base. RoPE covers the full ``head_dim`` (rotate-half convention).
        rms_norm_eps: epsilon of the transformer RMSNorms.
        attention_bias: whether q/k/v/o projections carry a bias.
        hidden_act: MLP activation (``silu`` or ``gelu``).
        layer_scale_initial_scale: LayerScale init (training only; weights come from the checkpoint).
        max_position_embeddings: informational upper bound on frames.
        latent_dim: width between ``pre_conv`` and the upsampling ConvNeXt blocks.
        decoder_dim: width after ``decoder.0``; halved by each upsampling block.
        upsampling_ratios: ConvTranspose strides of the ConvNeXt upsampling stage.
        upsample_rates: ConvTranspose strides of the waveform decoder blocks.
        attention_dropout: training only.
    """

    codebook_size: int = 2048
    codebook_dim: int | None = None
    num_quantizers: int = 16
    hidden_size: int = 1024
    head_dim: int | None = None
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    sliding_window: int = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    latent_dim: int = 1024
    decoder_dim: int = 1536
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    attention_dropout: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("upsampling_ratios", "upsample_rates"):
            rates = getattr(self, name)
            if not isinstance(rates, list | tuple) or not all(type(r) is int for r in rates):
                raise DecoderConfigError(f"decoder_config.{name} must be a list of integers, found {rates!r}")
            object.__setattr__(self, name, tuple(rates))
        self._check_types_and_sizes()  # before any arithmetic: 0 heads must not divide, 10**9 must not allocate
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        self._validate()

    def _check_types_and_sizes(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (
                f.type in ("int", "int | None")
                and value is not None
                and (not isinstance(value, int) or isinstance(value, bool))
            ):
                raise DecoderConfigError(f"decoder_config.{f.name} must be an integer, found {value!r}")
            if f.type == "float" and (
                not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise DecoderConfigError(f"decoder_config.{f.name} must be a finite number, found {value!r}")
            if f.name in SIZE_LIMITS and value is not None and not 1 <= value <= SIZE_LIMITS[f.name]:
                raise DecoderConfigError(
                    f"decoder_config.{f.name} must be between 1 and {SIZE_LIMITS[f.name]}, found {value}. "
                    "Fix the checkpoint's speech_tokenizer/config.json."
                )
        for name in ("upsampling_ratios", "upsample_rates"):
            rates = getattr(self, name)
            if len(rates) > MAX_UPSAMPLE_STAGES or not all(1 <= r <= MAX_UPSAMPLE_RATE for r in rates):
                raise DecoderConfigError(
                    f"decoder_config.{name} must be at most {MAX_UPSAMPLE_STAGES} integers in 1..{MAX_UPSAMPLE_RATE}, "
                    f"found {list(rates)[: MAX_UPSAMPLE_STAGES + 1]}"
                )
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise DecoderConfigError(
                f"decoder_config: rope_theta and rms_norm_eps must be > 0, found {self.rope_theta}, {self.rms_norm_eps}"
            )

    def _validate(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise DecoderConfigError(f"decoder_config: {what}. Fix the checkpoint's speech_tokenizer/config.json.")

        need(self.codebook_dim is not None, "codebook_dim is missing (released checkpoints set it, e.g. 512)")
        need(self.codebook_dim % 2 == 0, f"codebook_dim must be even, found {self.codebook_dim}")
        need(
            self.num_quantizers >= 2,
            f"num_quantizers must be >= 2 (1 semantic + acoustic), found {self.num_quantizers}",
        )
        need(self.codebook_size >= 1, f"codebook_size must be >= 1, found {self.codebook_size}")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
            f"({self.num_key_value_heads})",
        )
        need(
            self.head_dim >= 2 and self.head_dim % 2 == 0,
            f"head_dim must be even and >= 2 for RoPE, found {self.head_dim}",
        )
        need(self.sliding_window >= 1, f"sliding_window must be >= 1, found {self.sliding_window}")
        need(
            self.hidden_act in SUPPORTED_ACTIVATIONS,
            f"hidden_act must be one of {SUPPORTED_ACTIVATIONS}, found {self.hidden_act!r}",
        )
        need(
            len(self.upsample_rates) >= 1 and all(r >= 1 for r in self.upsample_rates),
            f"upsample_rates must be positive integers, found {list(self.upsample_rates)}",
        )
        need(
            all(r >= 1 for r in self.upsampling_ratios),
            f"upsampling_ratios must be positive integers, found {list(self.upsampling_ratios)}",
        )
        need(
            self.decoder_dim % 2 ** len(self.upsample_rates) == 0,
            f"decoder_dim ({self.decoder_dim}) must be divisible by 2**len(upsample_rates) "
            f"({2 ** len(self.upsample_rates)})",
        )
        rope_scaling = self.extra.get("rope_scaling")
        need(
            rope_scaling in (None, {})
            or (
                isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default"
            ),
            f"only default RoPE is implemented, found rope_scaling={rope_scaling!r}",
        )

    @property
    def total_upsample(self) -> int:
        """Waveform samples per codec frame (1920 in released checkpoints)."""
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @property
    def num_key_value_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3TTSTokenizerV2DecoderConfig:
        """Build from a ``decoder_config`` dict; unknown keys are kept in ``extra``."""
        if not isinstance(values, dict):
            raise DecoderConfigError(f"decoder_config must be a JSON object, found {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in values.items() if k in names}
        extra = {k: v for k, v in values.items() if k not in names}
        try:
            return cls(**known, extra=extra)
        except TypeError as exc:  # a field of the wrong JSON type, e.g. a string where a number belongs
            raise DecoderConfigError(f"decoder_config has a field of the wrong type: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        values["upsampling_ratios"] = list(self.upsampling_ratios)
        values["upsample_rates"] = list(self.upsample_rates)
        values.update(self.extra)
        return values

    @classmethod
    def released(cls) -> Qwen3TTSTokenizerV2DecoderConfig:
        """The geometry of the released ``Qwen/Qwen3-TTS-12Hz-*`` speech tokenizer decoder."""
        return cls(
            codebook_size=2048,
            codebook_dim=512,
            num_quantizers=16,
            hidden_size=512,
            head_dim=64,
            num_attention_heads=16,
            num_key_value_heads=16,
            intermediate_size=1024,
            num_hidden_layers=8,
            sliding_window=72,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            attention_bias=False,
            hidden_act="silu",
            latent_dim=1024,
            decoder_dim=1536,
            upsampling_ratios=(2, 2),
            upsample_rates=(8, 5, 4, 3),
        )

    @classmethod
    def small(cls) -> Qwen3TTSTokenizerV2DecoderConfig:
        """A small geometry for tests: every structural feature of the released one (split RVQ,
        explicit head_dim != hidden/heads, GQA, attention bias, a sliding window much shorter
        than test streams, a ConvNeXt upsampling stage and three decoder blocks) at a fraction of the
        compute. 48 samples per frame.
        """
        return cls(
            codebook_size=2048,
            codebook_dim=64,
            num_quantizers=16,
            hidden_size=64,
            head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            num_hidden_layers=2,
            sliding_window=8,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            attention_bias=True,
            hidden_act="silu",
            latent_dim=96,
            decoder_dim=64,
            upsampling_ratios=(2,),
            upsample_rates=(4, 3, 2),
        )


@dataclass(frozen=True)
class Qwen3TTSTokenizerV2Config:
    """The speech tokenizer's ``config.json``: decoder geometry plus sample-rate bookkeeping.

    ``encoder_config`` (a Mimi encoder) is kept as a raw dict: the decoder never uses it.
    """

    decoder_config: Qwen3TTSTokenizerV2DecoderConfig
    encoder_config: dict[str, Any] = field(default_factory=dict)
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = OUTPUT_SAMPLE_RATE
    output_sample_rate: int = OUTPUT_SAMPLE_RATE
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920
    model_type: str = "qwen3_tts_tokenizer_12hz"

    def __post_init__(self) -> None:
        for name in (
            "encoder_valid_num_quantizers",
            "input_sample_rate",
            "output_sample_rate",
            "decode_upsample_rate",
            "encode_downsample_rate",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 24:
                raise DecoderConfigError(f"{name} must be an integer in 1..{1 << 24}, found {value!r}")
        if self.decode_upsample_rate != self.decoder_config.total_upsample:
            raise DecoderConfigError(
                f"decode_upsample_rate is {self.decode_upsample_rate} but the decoder's rates "
                f"{list(self.decoder_config.upsampling_ratios)} x {list(self.decoder_config.upsample_rates)} "
                f"give {self.decoder_config.total_upsample} samples per frame; the two must agree"
            )

    @property
    def frame_rate(self) -> float:
        """Codec frames per second (12.5 for released checkpoints)."""
        return self.output_sample_rate / self.decode_upsample_rate

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3TTSTokenizerV2Config:
        if not isinstance(values, dict):
            raise DecoderConfigError(f"a speech tokenizer config is a JSON object, found {type(values).__name__}")
        if "decoder_config" not in values:
            raise DecoderConfigError(
                "speech tokenizer config has no 'decoder_config'; expected the layout of a released "
                f"Qwen3-TTS-12Hz checkpoint's speech_tokenizer/config.json (found keys: {sorted(values)})"
            )
        decoder = Qwen3TTSTokenizerV2DecoderConfig.from_dict(values["decoder_config"])
        kwargs = {
            name: values[name]
            for name in (
                "encoder_config",
                "encoder_valid_num_quantizers",
                "input_sample_rate",
                "output_sample_rate",
                "encode_downsample_rate",
                "model_type",
            )
            if name in values
        }
        return cls(
            decoder_config=decoder,
            decode_upsample_rate=values.get("decode_upsample_rate", decoder.total_upsample),
            **kwargs,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "architectures": ["Qwen3TTSTokenizerV2Model"],
            "encoder_config": self.encoder_config,
            "decoder_config": self.decoder_config.to_dict(),
            "encoder_valid_num_quantizers": self.encoder_valid_num_quantizers,
            "input_sample_rate": self.input_sample_rate,
            "output_sample_rate": self.output_sample_rate,
            "decode_upsample_rate": self.decode_upsample_rate,
            "encode_downsample_rate": self.encode_downsample_rate,
        }

    @classmethod
    def from_json_file(cls, path: str | Path) -> Qwen3TTSTokenizerV2Config:
        path = Path(path)
        if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
            raise DecoderConfigError(
                f"{path} is {path.stat().st_size} bytes; a speech tokenizer config is a few KB "
                f"(at most {MAX_CONFIG_BYTES}): it is not a config.json"
            )
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise DecoderConfigError(f"no speech tokenizer config at {path}") from exc
        except (OSError, UnicodeDecodeError, RecursionError, ValueError) as exc:  # JSONDecodeError is a ValueError
            what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise DecoderConfigError(f"{path} is not valid JSON in UTF-8 ({what}); re-download the checkpoint") from exc
        if not isinstance(values, dict):
            raise DecoderConfigError(f"{path} must hold a JSON object, found {type(values).__name__}")
        if json_depth(values, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
            raise DecoderConfigError(f"{path} nests deeper than {MAX_CONFIG_DEPTH} levels; it is not a config.json")
        return cls.from_dict(values)
