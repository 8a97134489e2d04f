"""Code2Wav: the decoder of the Qwen3-TTS 12 Hz speech tokenizer (codec frames -> 24 kHz audio).

Our own implementation of the released architecture. Module paths equal the checkpoint's tensor
names (less the ``decoder.`` prefix), so ``speech_tokenizer/model.safetensors`` loads directly.

Written for export: attention uses an explicit banded causal mask built from ``arange`` (no
transformers mask utilities, no cache objects), every loop runs over modules (never over data),
and the only data-dependent checks sit in :meth:`Qwen3TTSTokenizerV2Decoder.forward`, outside the
traced :meth:`~Qwen3TTSTokenizerV2Decoder.decode_unchecked`. ``torch.export``, ExecuTorch lowering and
the legacy ONNX exporter all take it.

Pipeline (shapes for one sequence of ``T`` frames, released sizes in brackets):
    codes int64[B, Q=16, T] -> split RVQ [B, 512, T] -> pre_conv [B, 1024, T]
    -> pre_transformer [B, 1024, T] -> upsample x2 (ConvTranspose + ConvNeXt) [B, 1024, 4T]
    -> decoder.0..6 (SnakeBeta / ConvTranspose / residual units) [B, 1, 1920 T] -> clamp(-1, 1)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2DecoderConfig
from .errors import DecoderWeightsError, InvalidCodesError

# ----------------------------------------------------------------------------------------------
# Convolutions
# ----------------------------------------------------------------------------------------------


class CausalConv1d(nn.Module):
    """Conv1d with ``(kernel_size - 1) * dilation`` zeros on the left: output frame t sees inputs <= t.

    Stride is always 1 in this decoder, so the output is as long as the input.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.left_pad = (kernel_size - 1) * dilation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(hidden, (self.left_pad, 0)))


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d whose ``kernel_size - stride`` trailing samples are dropped: ``T`` in, ``T * stride`` out.

    The dropped samples are the part that depends on the next input frame, which keeps it causal.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.conv(hidden)
        return out[..., : hidden.shape[-1] * self.stride]


class SnakeBeta(nn.Module):
    """``x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha))^2`` with per-channel ``alpha``, ``beta``.

    :meth:`precompute` folds the two per-channel constants into buffers (the same float ops, so
    the same values); loading new weights clears them again.
    """

    no_div_by_zero = 1e-9

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.register_buffer("alpha_exp", None, persistent=False)
        self.register_buffer("beta_inv", None, persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.clear_precomputed())

    def constants(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(exp(alpha), 1 / (exp(beta) + 1e-9))``, each ``[1, C, 1]``."""
        alpha = torch.exp(self.alpha[None, :, None])
        beta = torch.exp(self.beta[None, :, None])
        return alpha, 1.0 / (beta + self.no_div_by_zero)

    @torch.no_grad()
    def precompute(self) -> None:
        self.alpha_exp, self.beta_inv = (t.detach().clone() for t in self.constants())

    def clear_precomputed(self) -> None:
        self.alpha_exp = None
        self.beta_inv = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.alpha_exp is None:
            alpha_exp, beta_inv = self.constants()
        else:
            alpha_exp, beta_inv = self.alpha_exp, self.beta_inv
        return hidden + beta_inv * torch.pow(torch.sin(hidden * alpha_exp), 2)


# ----------------------------------------------------------------------------------------------
# Split residual vector quantizer (decode side only)
# ----------------------------------------------------------------------------------------------


class Codebook(nn.Module):
    """One codebook; the checkpoint stores running sums, the vectors are ``embedding_sum / usage``."""

    epsilon = 1e-5

    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))

    def embedding(self) -> torch.Tensor:
        """``float[codebook_size, dim]``."""
        return self.embedding_sum / self.cluster_usage.clamp(min=self.epsilon)[:, None]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``int64[B, T]`` -> ``float[B, T, dim]``."""
        return F.embedding(codes, self.embedding())


class CodebookLayer(nn.Module):
    """Holds one codebook under the checkpoint's ``_codebook`` name."""

    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(codebook_size, dim)


class CodebookStack(nn.Module):
    def __init__(self, num_codebooks: int, codebook_size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(CodebookLayer(codebook_size, dim) for _ in range(num_codebooks))


class ResidualCodebookGroup(nn.Module):
    """A group of residual codebooks: sum the lookups, then project ``dim -> output_dim`` (1x1 conv).

    ``input_proj`` is the encoder-side projection. It is part of the checkpoint layout, so it is
    kept here for a strict load, but decoding never uses it.
    """

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int, output_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(output_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, output_dim, 1, bias=False)
        self.vq = CodebookStack(num_codebooks, codebook_size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``int64[B, K, T]`` -> ``float[B, output_dim, T]``."""
        quantized = None
        for index, layer in enumerate(self.vq.layers):
            lookup = layer._codebook.decode(codes[:, index]).transpose(1, 2)
            quantized = lookup if quantized is None else quantized + lookup
        return self.output_proj(quantized)


class SplitResidualVectorQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) in two groups whose outputs add up."""

    num_semantic = 1

    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        dim = config.codebook_dim // 2
        self.rvq_first = ResidualCodebookGroup(self.num_semantic, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = ResidualCodebookGroup(
            config.num_quantizers - self.num_semantic, config.codebook_size, dim, config.codebook_dim
        )

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``int64[B, Q, T]`` -> ``float[B, codebook_dim, T]``."""
        first = self.rvq_first.decode(codes[:, : self.num_semantic])
        return first + self.rvq_rest.decode(codes[:, self.num_semantic :])


# ----------------------------------------------------------------------------------------------
# Pre-transformer (sliding-window causal attention)
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden.to(dtype)


class LayerScale(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(channels))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.scale * hidden


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Eager decodes longer than this many frames compute attention in blocks (memory linear in T, not T**2).
ATTENTION_BLOCK_FRAMES = 512


def rope_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """``float32[head_dim // 2]``: the RoPE angle per position for each rotated pair."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta**exponents)


def sliding_window_mask(num_frames: int, window: int, device: torch.device) -> torch.Tensor:
    """Additive mask ``float32[T, T]``: 0 where ``0 <= query - key < window``, ``-inf`` elsewhere."""
    positions = torch.arange(num_frames, device=device)
    distance = positions[:, None] - positions[None, :]
    allowed = (distance >= 0) & (distance < window)
    return torch.zeros(num_frames, num_frames, device=device).masked_fill(~allowed, float("-inf"))


class Attention(nn.Module):
    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | int
    ) -> torch.Tensor:
        """``hidden [B, T, H]``, ``cos``/``sin [T, head_dim]``, additive ``mask [T, T]`` -> ``[B, T, H]``.

        ``mask`` may instead be the sliding window (an int): attention is then computed in blocks of
        :data:`ATTENTION_BLOCK_FRAMES` queries against only the keys their window reaches, so memory
        grows with ``T`` instead of ``T**2`` (what long eager decodes use; exported graphs keep the mask).
        """
        batch, frames, _ = hidden.shape
        query = self.q_proj(hidden).view(batch, frames, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(hidden).view(batch, frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(hidden).view(batch, frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        if isinstance(mask, int):
            attended = torch.cat(
                [
                    self._attend(query, key, value, start, min(start + ATTENTION_BLOCK_FRAMES, frames), mask)
                    for start in range(0, frames, ATTENTION_BLOCK_FRAMES)
                ],
                dim=2,
            )
        else:
            scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling + mask
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            attended = torch.matmul(weights, value)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, frames, -1))

    def _attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int, end: int, window: int
    ) -> torch.Tensor:
        """Queries ``start:end`` against the keys their sliding window reaches (``start - window + 1 : end``)."""
        first = max(0, start - window + 1)
        device = query.device
        distance = torch.arange(start, end, device=device)[:, None] - torch.arange(first, end, device=device)
        mask = torch.zeros(distance.shape, device=query.device, dtype=query.dtype).masked_fill(
            (distance < 0) | (distance >= window), float("-inf")
        )
        scores = torch.matmul(query[:, :, start:end], key[:, :, first:end].transpose(2, 3)) * self.scaling + mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, value[:, :, first:end])


class GatedMlp(nn.Module):
    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = nn.SiLU() if config.hidden_act == "silu" else nn.GELU()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(hidden)) * self.up_proj(hidden))


class TransformerLayer(nn.Module):
    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.self_attn_layer_scale = LayerScale(config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMlp(config)
        self.mlp_layer_scale = LayerScale(config.hidden_size)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | int
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(hidden), cos, sin, mask))
        return hidden + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(hidden)))


class PreTransformer(nn.Module):
    """``latent_dim -> hidden_size``, pre-norm layers with sliding-window attention, ``-> latent_dim``."""

    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        self.sliding_window = config.sliding_window
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config.head_dim, config.rope_theta), persistent=False)

    def rotary(self, num_frames: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, head_dim]`` for absolute positions ``0 .. T-1`` (computed in float32)."""
        positions = torch.arange(num_frames, device=device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq.float()[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, latent_dim]`` -> ``[B, T, latent_dim]``."""
        hidden = self.input_proj(hidden)
        frames = hidden.shape[1]
        cos, sin = self.rotary(frames, hidden.device, hidden.dtype)
        tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
        if frames > ATTENTION_BLOCK_FRAMES and not tracing:
            mask: torch.Tensor | int = self.sliding_window  # blocked attention: memory linear in T
        else:
            mask = sliding_window_mask(frames, self.sliding_window, hidden.device).to(hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, mask)
        return self.output_proj(self.norm(hidden))


# ----------------------------------------------------------------------------------------------
# Upsampling and waveform decoder
# ----------------------------------------------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k=7) -> LayerNorm -> Linear x4 -> GELU -> Linear -> gamma, plus residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        branch = self.dwconv(hidden).transpose(1, 2)
        branch = self.pwconv2(self.act(self.pwconv1(self.norm(branch))))
        return hidden + (self.gamma * branch).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.conv2(self.act2(self.conv1(self.act1(hidden))))


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal ConvTranspose (k=2r, s=r, channels halve) -> residual units at dilation 1, 3, 9."""

    dilations = (1, 3, 9)

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate)]
            + [ResidualUnit(out_dim, dilation) for dilation in self.dilations]
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for module in self.block:
            hidden = module(hidden)
        return hidden


# ----------------------------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------------------------


class Qwen3TTSTokenizerV2Decoder(nn.Module):
    """Codec frames ``int64[B, num_quantizers, T]`` -> waveform ``float[B, 1, T * total_upsample]`` in [-1, 1].

    Strictly causal: the audio of frame ``t`` depends only on frames ``<= t``.
    """

    def __init__(self, config: Qwen3TTSTokenizerV2DecoderConfig):
        super().__init__()
        self.config = config
        self.total_upsample = config.total_upsample
        self.quantizer = SplitResidualVectorQuantizer(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = PreTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    CausalConvTranspose1d(config.latent_dim, config.latent_dim, ratio, ratio),
                    ConvNeXtBlock(config.latent_dim),
                ]
            )
            for ratio in config.upsampling_ratios
        )
        stages = len(config.upsample_rates)
        decoder: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, kernel_size=7)]
        for index, rate in enumerate(config.upsample_rates):
            decoder.append(DecoderBlock(config.decoder_dim // 2**index, config.decoder_dim // 2 ** (index + 1), rate))
        output_dim = config.decoder_dim // 2**stages
        decoder += [SnakeBeta(output_dim), CausalConv1d(output_dim, 1, kernel_size=7)]
        self.decoder = nn.ModuleList(decoder)

    # -- contract checks -----------------------------------------------------------------------

    def check_codes(self, codes: torch.Tensor, check_values: bool = True) -> None:
        """Raise :class:`InvalidCodesError` unless ``codes`` is ``int[B, num_quantizers, T>=1]`` in range.

        ``check_values`` reads the data (min/max), so traced graphs skip it.
        """
        q, size = self.config.num_quantizers, self.config.codebook_size
        if not isinstance(codes, torch.Tensor):
            raise InvalidCodesError(f"codes must be a torch.Tensor int64[B, {q}, T], found {type(codes).__name__}")
        if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise InvalidCodesError(
                f"codes must be an integer tensor (int64), found {codes.dtype}; codec ids are integers 0..{size - 1}"
            )
        if codes.dim() != 3:
            raise InvalidCodesError(f"codes must have shape [B, {q}, T] (rank 3), found shape {list(codes.shape)}")
        if codes.shape[1] != q:
            raise InvalidCodesError(
                f"codes must have {q} codebooks on dim 1 ([B, {q}, T]), found {codes.shape[1]} "
                f"(shape {list(codes.shape)}); frame-major codes need .transpose(1, 2)"
            )
        if codes.shape[0] == 0 or codes.shape[2] == 0:
            raise InvalidCodesError(f"codes must hold at least one frame, found shape {list(codes.shape)}")
        if check_values:
            low, high = int(codes.min()), int(codes.max())
            if low < 0 or high >= size:
                bad = ((codes < 0) | (codes >= size)).nonzero()[0].tolist()
                raise InvalidCodesError(
                    f"codes must lie in 0..{size - 1}, found values in {low}..{high} "
                    f"(first bad at [batch, codebook, frame] = {bad}, value {int(codes[tuple(bad)])})"
                )

    # -- weights -------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy ``weights`` (decoder-relative names: the checkpoint's less ``decoder.``); return the names loaded.

        Every parameter must be present with its exact shape and no extra tensor may exist: anything
        else means the checkpoint and the config disagree, and a partial load would decode noise.
        Raises :class:`DecoderWeightsError` naming each problem (at most 20 names of each kind).
        """
        tensors = dict(weights)
        expected = self.state_dict()
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected))
        misshapen = sorted(
            f"{name}: expected {list(expected[name].shape)}, found {list(tensors[name].shape)}"
            for name in set(expected) & set(tensors)
            if tuple(expected[name].shape) != tuple(tensors[name].shape)
        )
        problems = []
        if missing:
            problems.append(f"missing {len(missing)} tensor(s): " + ", ".join(f"decoder.{n}" for n in missing[:20]))
        if unexpected:
            problems.append(
                f"unexpected {len(unexpected)} tensor(s): " + ", ".join(f"decoder.{n}" for n in unexpected[:20])
            )
        if misshapen:
            problems.append(
                f"{len(misshapen)} tensor(s) with the wrong shape: decoder." + "; decoder.".join(misshapen[:20])
            )
        if problems:
            raise DecoderWeightsError(
                "the checkpoint's decoder weights do not match speech_tokenizer/config.json: "
                + " | ".join(problems)
                + ". Use the config.json that came with these weights."
            )
        for name, tensor in tensors.items():
            if not (tensor.dtype.is_floating_point and torch.isfinite(tensor).all()):
                kind = "non-finite values" if tensor.dtype.is_floating_point else f"dtype {tensor.dtype}"
                raise DecoderWeightsError(f"decoder.{name} has {kind}; expected finite floating-point weights")
        self.load_state_dict(tensors, strict=True)
        return set(tensors)

    # -- decode --------------------------------------------------------------------------------

    @torch.no_grad()
    def precompute_snake_caches(self) -> None:
        """Fold every SnakeBeta's ``exp(alpha)`` and ``1/(exp(beta)+1e-9)`` into buffers (call after loading)."""
        for module in self.modules():
            if isinstance(module, SnakeBeta):
                module.precompute()

    def decode_unchecked(self, codes: torch.Tensor) -> torch.Tensor:
        """The stateless full decode of ``int64[B, Q, T]`` -> ``float[B, 1, T * total_upsample]``.

        No input checks (they would read the data): this is the function export wrappers trace.
        """
        hidden = self.quantizer.decode(codes)
        hidden = self.pre_conv(hidden).transpose(1, 2)
        hidden = self.pre_transformer(hidden).transpose(1, 2)
        for transpose_conv, convnext in self.upsample:
            hidden = convnext(transpose_conv(hidden))
        for module in self.decoder:
            hidden = module(hidden)
        return hidden.clamp(min=-1.0, max=1.0)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Checked full decode; see :meth:`decode_unchecked`. Value checks are skipped while tracing.

        Any integer dtype is accepted (and read as int64). At most ``config.max_position_embeddings``
        frames: memory grows linearly with T (about 20 GB at 8,000 frames at the released geometry),
        so longer inputs are refused before anything is allocated; decode them with a stream decoder
        or :meth:`chunked_decode`.
        """
        tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
        self.check_codes(codes, check_values=not tracing)
        if not tracing:
            limit = self.config.max_position_embeddings
            if codes.shape[-1] > limit:
                raise InvalidCodesError(
                    f"codes hold {codes.shape[-1]} frames; a full decode takes at most {limit} "
                    "(max_position_embeddings; memory grows with T): decode longer inputs in pieces with a "
                    "stream decoder (vllm_omni.edge.runtime) or chunked_decode()"
                )
            if codes.dtype != torch.int64:
                codes = codes.to(torch.int64)
        return self.decode_unchecked(codes)

    @torch.no_grad()
    def chunked_decode(self, codes: torch.Tensor, chunk_size: int = 300, left_context_size: int = 25) -> torch.Tensor:
        """Approximate long-input decode, as the official implementation does it.

        Decodes ``chunk_size`` frames at a time, each with up to ``left_context_size`` frames of
        already-decoded history in front, and keeps only the chunk's audio. The transformer and
        convolutions see a truncated past, so chunks after the first differ from the full decode.
        """
        if chunk_size < 1 or left_context_size < 0:
            raise ValueError(
                f"chunk_size must be >= 1 and left_context_size >= 0, found {chunk_size}, {left_context_size}"
            )
        self.check_codes(codes)
        codes = codes.to(torch.int64)
        frames = codes.shape[-1]
        pieces = []
        for start in range(0, frames, chunk_size):
            end = min(start + chunk_size, frames)
            context = min(left_context_size, start)
            audio = self.decode_unchecked(codes[..., start - context : end])
            pieces.append(audio[..., context * self.total_upsample :])
        return torch.cat(pieces, dim=-1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["Qwen3TTSTokenizerV2Decoder", "SnakeBeta"]
