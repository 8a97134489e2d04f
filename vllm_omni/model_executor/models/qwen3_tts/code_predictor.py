"""The Qwen3-TTS code predictor: codebooks 1..15 of a frame from the talker's state and codebook 0.

For each frame, a small Qwen3-style transformer (q/k RMSNorm, 1-D RoPE at positions 0..16, causal
attention, SwiGLU) runs a fresh sequence: the talker's final hidden state, then the talker's codec
embedding of codebook 0, then its own embedding of each residual code it produced. Head ``g``
(0-based) reads the last position and gives codebook ``g + 1``. It is re-run once per residual
codebook with a KV cache of at most 16 positions, as the official ``generate(max_new_tokens=15)``.

The sequence is private to one frame and short, so it runs in plain torch inside the talker's
forward, not on vLLM's paged KV cache: once per engine step for every frame the step completes,
whatever request it belongs to (the passes read the weights once for the whole batch). Checkpoint
names are those under ``talker.code_predictor.``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .residual_sampler import ResidualSampling
from .tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import RMSNorm  # float32 statistics, as the official

if TYPE_CHECKING:  # plain torch at run time: tools/gpu_check.py runs this module where transformers is absent
    from .configuration_qwen3_tts import Qwen3TTSCodePredictorConfig


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class PredictorAttention(nn.Module):
    def __init__(self, config: Qwen3TTSCodePredictorConfig) -> None:
        super().__init__()
        hidden, self.head_dim = config.hidden_size, config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor, start: int
    ) -> torch.Tensor:
        """``x`` [B, S, H] at positions ``start .. start + S - 1``; ``cache`` [2, B, kv_heads, P, D] holds K
        (rotated) and V of the positions before ``start`` and receives this call's. Causal: the first call
        (``start`` 0) masks its later positions; each later call (S = 1) sees every position so far."""
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        cache[0, :, :, start : start + seq] = k * cos + rotate_half(k) * sin
        cache[1, :, :, start : start + seq] = v
        keys, values = cache[0, :, :, : start + seq].unsqueeze(2), cache[1, :, :, : start + seq].unsqueeze(2)
        # Grouped-query attention without copying K/V per query head: query head h reads kv head h // groups.
        q = q.view(batch, self.kv_heads, self.heads // self.kv_heads, seq, self.head_dim)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * self.head_dim**-0.5
        if seq > 1:
            causal = torch.ones(seq, start + seq, dtype=torch.bool, device=x.device).tril(diagonal=start)
            scores = scores.masked_fill(~causal, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, values).reshape(batch, self.heads, seq, self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class PredictorLayer(nn.Module):
    def __init__(self, config: Qwen3TTSCodePredictorConfig) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.self_attn = PredictorAttention(config)
        self.mlp = nn.ModuleDict(
            {
                "gate_proj": nn.Linear(hidden, inter, bias=False),
                "up_proj": nn.Linear(hidden, inter, bias=False),
                "down_proj": nn.Linear(inter, hidden, bias=False),
            }
        )
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache, start):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start)
        h = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


class PredictorModel(nn.Module):
    def __init__(self, config: Qwen3TTSCodePredictorConfig, talker_hidden_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PredictorLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Residual-code embeddings live in the talker's width (they feed the talker too).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.vocab_size, talker_hidden_size) for _ in range(config.num_code_groups - 1)
        )


class Qwen3TTSCodePredictor(nn.Module):
    """``talker.code_predictor``: model, 15 heads, and the projection from the talker's width."""

    def __init__(self, config: Qwen3TTSCodePredictorConfig, talker_hidden_size: int) -> None:
        super().__init__()
        self.config = config
        self.model = PredictorModel(config, talker_hidden_size)
        self.lm_head = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_code_groups - 1)
        )
        if config.hidden_size != talker_hidden_size:
            self.small_to_mtp_projection = nn.Linear(talker_hidden_size, config.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()
        inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._rope_tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rope_table(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [positions, head_dim] of every position a frame uses (0 .. groups), made once per device
        and dtype (a module moved to another device makes its table again there)."""
        key = (self.inv_freq.device, dtype)
        table = self._rope_tables.get(key)
        if table is None:
            positions = torch.arange(self.config.num_code_groups, dtype=torch.float32, device=self.inv_freq.device)
            freqs = torch.outer(positions, self.inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            table = self._rope_tables[key] = (angles.cos().to(dtype), angles.sin().to(dtype))
        return table

    @torch.inference_mode()
    def predict(
        self, talker_hidden: torch.Tensor, code0_embeds: torch.Tensor, sampling: ResidualSampling
    ) -> torch.Tensor:
        """Residual codes ``int64[B, groups - 1]`` of B frames (of any requests), in one batch.

        ``talker_hidden`` and ``code0_embeds`` are [B, talker_hidden]; ``sampling`` holds each row's
        settings. Runs the ``groups - 1`` passes once for the whole batch, with one K/V buffer for all
        positions (nothing grows), the RoPE table made once, and every tensor on the inputs' device.
        """
        config, layers = self.config, self.model.layers
        batch, dtype = talker_hidden.shape[0], talker_hidden.dtype
        caches = torch.empty(
            len(layers), 2, batch, config.num_key_value_heads, config.num_code_groups, config.head_dim, dtype=dtype,
            device=talker_hidden.device,
        )  # fmt: skip
        cos_table, sin_table = self._rope_table(dtype)
        x = torch.stack((talker_hidden, code0_embeds), dim=1)
        codes: list[torch.Tensor] = []
        start = 0
        for group in range(config.num_code_groups - 1):
            x = self.small_to_mtp_projection(x)
            seq = x.shape[1]
            cos, sin = cos_table[start : start + seq], sin_table[start : start + seq]
            for index, layer in enumerate(layers):
                x = layer(x, cos, sin, caches[index], start)
            start += seq
            code = sampling.pick(group, self.lm_head[group](self.model.norm(x[:, -1])))
            codes.append(code)
            x = self.model.codec_embedding[group](code).unsqueeze(1)
        return torch.stack(codes, dim=1)
