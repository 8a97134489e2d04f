"""Configuration of the Qwen3-TTS talker, read from a released checkpoint's root ``config.json``.

``Qwen3TTSConfig`` (``model_type: qwen3_tts``) holds the special text ids and ``talker_config``
(``Qwen3TTSTalkerConfig``), which holds the codec control ids, the speaker and language tables and
``code_predictor_config`` (``Qwen3TTSCodePredictorConfig``). Field names are those of the released
configs and of the official ``qwen-tts`` classes, so the same JSON loads in both.

vLLM sizes its KV cache and its sampler from ``get_text_config()``. That is an *engine view* of
the talker (:meth:`Qwen3TTSConfig.engine_text_config`): the talker LM's sizes, plain 1-D RoPE
(see ``modeling_qwen3_tts_talker``: for speech the three multimodal position streams are equal,
so the interleaved M-RoPE of the official model is exactly 1-D RoPE), and a vocabulary widened by
the residual-code channel (``frame_channel``).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from .engine_contract import engine_vocab_size

# The official wrapper's generation defaults where a checkpoint's generation_config.json lacks a
# field (qwen-tts 0.1.1 ``Qwen3TTSModel._merge_generate_kwargs``); released checkpoints ship the same
# values with max_new_tokens 8192.
OFFICIAL_GENERATION_DEFAULTS = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 2048,
}


class Qwen3TTSCodePredictorConfig(PretrainedConfig):
    """The code predictor: a small transformer producing codebooks 1..15 of a frame."""

    model_type = "qwen3_tts_talker_code_predictor"

    def __init__(
        self,
        vocab_size: int = 2048,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 5,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 8,
        head_dim: int = 128,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1_000_000.0,
        num_code_groups: int = 16,
        attention_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.num_code_groups = num_code_groups
        self.attention_bias = attention_bias
        kwargs.pop("rope_scaling", None)
        kwargs.pop("rope_parameters", None)
        super().__init__(**kwargs)


class Qwen3TTSTalkerConfig(PretrainedConfig):
    """The talker LM (a Qwen3 decoder over codec ids), its text path and codec control ids."""

    model_type = "qwen3_tts_talker"
    sub_configs = {"code_predictor_config": Qwen3TTSCodePredictorConfig}  # noqa: RUF012 (transformers reads it from the class)

    def __init__(
        self,
        code_predictor_config: dict[str, Any] | Qwen3TTSCodePredictorConfig | None = None,
        vocab_size: int = 3072,
        hidden_size: int = 1024,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 2,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10_000.0,
        rope_scaling: dict[str, Any] | None = None,
        attention_bias: bool = False,
        num_code_groups: int = 16,
        text_hidden_size: int = 2048,
        text_vocab_size: int = 151_936,
        codec_eos_token_id: int = 4198,
        codec_think_id: int = 4202,
        codec_nothink_id: int = 4203,
        codec_think_bos_id: int = 4204,
        codec_think_eos_id: int = 4205,
        codec_pad_id: int = 4196,
        codec_bos_id: int = 4197,
        spk_id: dict[str, int] | None = None,
        spk_is_dialect: dict[str, str | bool] | None = None,
        codec_language_id: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(code_predictor_config, Qwen3TTSCodePredictorConfig):
            self.code_predictor_config = code_predictor_config
        else:
            self.code_predictor_config = Qwen3TTSCodePredictorConfig(**(code_predictor_config or {}))
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.mrope_scaling = dict(rope_scaling or {})
        self.attention_bias = attention_bias
        self.num_code_groups = num_code_groups
        self.text_hidden_size = text_hidden_size
        self.text_vocab_size = text_vocab_size
        self.codec_eos_token_id = codec_eos_token_id
        self.codec_think_id = codec_think_id
        self.codec_nothink_id = codec_nothink_id
        self.codec_think_bos_id = codec_think_bos_id
        self.codec_think_eos_id = codec_think_eos_id
        self.codec_pad_id = codec_pad_id
        self.codec_bos_id = codec_bos_id
        self.spk_id = dict(spk_id or {})
        self.spk_is_dialect = dict(spk_is_dialect or {})
        self.codec_language_id = dict(codec_language_id or {})
        kwargs.pop("rope_parameters", None)
        super().__init__(**kwargs)

    @property
    def codebook_size(self) -> int:
        return self.code_predictor_config.vocab_size


class Qwen3TTSSpeakerEncoderConfig(PretrainedConfig):
    """The Base (voice-clone) checkpoint's speaker encoder: an ECAPA-TDNN from 128 log-mels to one vector.

    Field names and defaults are the official ``Qwen3TTSSpeakerEncoderConfig``'s; released configs set
    only ``enc_dim`` (the talker's hidden size: 1024 at 0.6B, 2048 at 1.7B) and ``sample_rate``.

    mel_dim: log-mel bands in (the official feature extraction is fixed at 128).
    enc_dim: width of the speaker embedding out.
    enc_channels: the initial TDNN's width, the SE-Res2Net blocks' widths, and the multi-layer feature
        aggregation's width last (the sum of the blocks' widths, as their outputs are concatenated).
    enc_kernel_sizes, enc_dilations: per layer of ``enc_channels``.
    enc_attention_channels: width of the attentive statistics pooling's attention.
    enc_res2net_scale: branches of each Res2Net block (widths must divide by it).
    enc_se_channels: bottleneck width of each squeeze-excitation.
    sample_rate: the rate, in Hz, of the audio the features are computed from.
    """

    model_type = "qwen3_tts_speaker_encoder"

    def __init__(
        self,
        mel_dim: int = 128,
        enc_dim: int = 1024,
        enc_channels: list[int] | tuple[int, ...] = (512, 512, 512, 512, 1536),
        enc_kernel_sizes: list[int] | tuple[int, ...] = (5, 3, 3, 3, 1),
        enc_dilations: list[int] | tuple[int, ...] = (1, 2, 3, 4, 1),
        enc_attention_channels: int = 128,
        enc_res2net_scale: int = 8,
        enc_se_channels: int = 128,
        sample_rate: int = 24000,
        **kwargs: Any,
    ) -> None:
        self.mel_dim = mel_dim
        self.enc_dim = enc_dim
        self.enc_channels = list(enc_channels)
        self.enc_kernel_sizes = list(enc_kernel_sizes)
        self.enc_dilations = list(enc_dilations)
        self.enc_attention_channels = enc_attention_channels
        self.enc_res2net_scale = enc_res2net_scale
        self.enc_se_channels = enc_se_channels
        self.sample_rate = sample_rate
        super().__init__(**kwargs)


# Talker LM sizes the engine view carries over unchanged (vocabulary and RoPE are the engine's own).
ENGINE_LM_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
)


class Qwen3TTSEngineTextConfig(PretrainedConfig):
    """What vLLM reads to size the KV cache, the RoPE and the sampler (see the module docstring)."""

    model_type = "qwen3_tts_engine_text"


class Qwen3TTSConfig(PretrainedConfig):
    """Root config of a Qwen3-TTS checkpoint (``model_type: qwen3_tts``)."""

    model_type = "qwen3_tts"
    sub_configs = {  # noqa: RUF012 (transformers reads it from the class)
        "talker_config": Qwen3TTSTalkerConfig,
        "speaker_encoder_config": Qwen3TTSSpeakerEncoderConfig,
    }

    def __init__(
        self,
        talker_config: dict[str, Any] | Qwen3TTSTalkerConfig | None = None,
        speaker_encoder_config: dict[str, Any] | Qwen3TTSSpeakerEncoderConfig | None = None,
        tokenizer_type: str | None = None,
        tts_model_size: str | None = None,
        tts_model_type: str | None = None,
        im_start_token_id: int = 151644,
        im_end_token_id: int = 151645,
        tts_pad_token_id: int = 151671,
        tts_bos_token_id: int = 151672,
        tts_eos_token_id: int = 151673,
        **kwargs: Any,
    ) -> None:
        if isinstance(talker_config, Qwen3TTSTalkerConfig):
            self.talker_config = talker_config
        else:
            self.talker_config = Qwen3TTSTalkerConfig(**(talker_config or {}))
        self.tokenizer_type = tokenizer_type
        self.tts_model_size = tts_model_size
        self.tts_model_type = tts_model_type
        self.im_start_token_id = im_start_token_id
        self.im_end_token_id = im_end_token_id
        self.tts_pad_token_id = tts_pad_token_id
        self.tts_bos_token_id = tts_bos_token_id
        self.tts_eos_token_id = tts_eos_token_id
        # Only the voice-clone (Base) checkpoint has one; None elsewhere.
        if speaker_encoder_config is None or isinstance(speaker_encoder_config, Qwen3TTSSpeakerEncoderConfig):
            self.speaker_encoder_config = speaker_encoder_config
        else:
            self.speaker_encoder_config = Qwen3TTSSpeakerEncoderConfig(**speaker_encoder_config)
        super().__init__(**kwargs)

    def engine_text_config(self) -> Qwen3TTSEngineTextConfig:
        """The talker LM as vLLM sees it: its sizes, 1-D RoPE, and the widened sampling vocabulary."""
        cached = self.__dict__.get("_engine_text_config")
        if cached is None:
            talker = self.talker_config
            cached = self.__dict__["_engine_text_config"] = Qwen3TTSEngineTextConfig(
                **{name: getattr(talker, name) for name in ENGINE_LM_FIELDS},
                vocab_size=engine_vocab_size(talker.vocab_size, talker.num_code_groups, talker.codebook_size),
                rope_parameters={"rope_type": "default", "rope_theta": float(talker.rope_theta)},
                tie_word_embeddings=False,
            )
        return cached

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> PretrainedConfig:
        return self.engine_text_config()

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.pop("_engine_text_config", None)
        return output

    @property
    def supported_languages(self) -> list[str]:
        """Language names a request may give, as the official package lists them (dialects excluded)."""
        names = [name for name in self.talker_config.codec_language_id if "dialect" not in name]
        return ["auto", *names]

    @property
    def supported_speakers(self) -> list[str]:
        return list(self.talker_config.spk_id)
