"""The Qwen3-TTS code predictor: codebooks 1..15 of a frame from the talker's state and codebook 0.

For each frame, a small Qwen3-style transformer (q/k RMSNorm, 1-D RoPE at positions 0..16, causal
attention, SwiGLU) runs a fresh sequence: the talker's final hidden state, then the talker's codec
embedding of codebook 0, then its own embedding of each residual code it produced. Head ``g``
(0-based) reads the last position and gives codebook ``g + 1``. It is re-run once per residual
codebook with a KV cache of at most 16 positions, as the official ``generate(max_new_tokens=15)``.

The sequence is private to one frame and short, so it runs in plain torch inside the talker's
forward, not on vLLM's paged KV cache. Checkpoint names are those under ``talker.code_predictor.``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .configuration_qwen3_tts import Qwen3TTSCodePredictorConfig
from .tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import RMSNorm  # float32 statistics, as the official


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
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list[torch.Tensor] | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``x`` [B, S, H] at the next S positions; ``cache`` holds K and V [B, kv_heads, P, D] of the P before."""
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        groups = self.heads // self.kv_heads
        keys = k.repeat_interleave(groups, dim=1)
        values = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.head_dim**-0.5
        past = keys.shape[2] - seq
        mask = torch.ones(seq, keys.shape[2], dtype=torch.bool).tril(diagonal=past)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, values).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out), [k, v]


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

    def forward(self, x, cos, sin, cache):
        attn, cache = self.self_attn(self.input_layernorm(x), cos, sin, cache)
        x = x + attn
        h = self.post_attention_layernorm(x)
        x = x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))
        return x, cache


class PredictorModel(nn.Module):
    def __init__(self, config: Qwen3TTSCodePredictorConfig, talker_hidden_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PredictorLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Residual-code embeddings live in the talker's width (they feed the talker too).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.vocab_size, talker_hidden_size) for _ in range(config.num_code_groups - 1)
        )


# Picks one code per row from [B, codebook] logits; the talker supplies greedy or seeded sampling.
CodePicker = Callable[[int, torch.Tensor], torch.Tensor]


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

    def _rope(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(positions, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _step(self, embeds: torch.Tensor, start: int, caches: list) -> torch.Tensor:
        x = self.small_to_mtp_projection(embeds)
        cos, sin = self._rope(start, x.shape[1], x.dtype)
        for index, layer in enumerate(self.model.layers):
            x, caches[index] = layer(x, cos, sin, caches[index])
        return self.model.norm(x[:, -1])

    @torch.inference_mode()
    def predict(self, talker_hidden: torch.Tensor, code0_embeds: torch.Tensor, pick: CodePicker) -> torch.Tensor:
        """Residual codes ``int64[B, groups - 1]`` for B frames.

        ``talker_hidden`` and ``code0_embeds`` are [B, talker_hidden]; ``pick(group, logits)``
        returns the chosen code per row for residual codebook ``group + 1``.
        """
        caches: list = [None] * len(self.model.layers)
        embeds = torch.stack((talker_hidden, code0_embeds), dim=1)
        codes: list[torch.Tensor] = []
        position = 0
        for group in range(self.config.num_code_groups - 1):
            hidden = self._step(embeds, position, caches)
            position += embeds.shape[1]
            code = pick(group, self.lm_head[group](hidden))
            codes.append(code)
            embeds = self.model.codec_embedding[group](code).unsqueeze(1)
        return torch.stack(codes, dim=1)

    def residual_embeddings(self, residual_codes: torch.Tensor) -> torch.Tensor:
        """Sum over codebooks 1..15 of their embeddings: ``[N, groups - 1]`` codes -> [N, talker_hidden]."""
        total = None
        for group, embedding in enumerate(self.model.codec_embedding):
            part = embedding(residual_codes[:, group])
            total = part if total is None else total + part
        return total


def sample_code(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> int:
    """One code from [codebook] logits with HF's warper order: temperature, top-k, top-p, then multinomial."""
    scores = logits.float() / max(temperature, 1e-5)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[-1] = False
        scores = scores.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def picker_for(rows: Sequence[tuple[bool, float, int, float, torch.Generator | None]]) -> CodePicker:
    """A picker that treats row ``i`` greedily or samples it with its own settings and generator."""

    def pick(_group: int, logits: torch.Tensor) -> torch.Tensor:
        chosen = logits.argmax(dim=-1)
        for row, (greedy, temperature, top_k, top_p, generator) in enumerate(rows):
            if not greedy:
                chosen[row] = sample_code(logits[row], temperature, top_k, top_p, generator)
        return chosen

    return pick
