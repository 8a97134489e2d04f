"""The Rockchip NPU formulation of the stateful step: the waveform stage with time on the height axis.

rknn-toolkit2 2.5.0 writes a tensor's width into 13-bit (rk3588, limit 8,191) or 14-bit (rk3576,
limit 16,383) register fields. The waveform blocks run 2,560 / 10,240 / 30,720 samples at B=16
(122,880 at B=64), so as 1-D convolutions (time = width) they overflow those fields: the toolkit
prints "REGTASK: The bit width of field value exceeds the limit" and a board may truncate them.
Measured on one-op graphs at the released channel counts and lengths (see docs/hardware/rockchip-npu.md):

- a dilated conv (k=7, dilation 9) overflows even at width 8,000 (the toolkit unrolls the
  dilation into a ``7 * width`` field) and took 271 s to compile at 122,880;
- with time on the *height* axis (``[1, C, T, 1]``, which is the same memory order) plain
  convolutions, ConvTranspose, SnakeBeta, Concat and Slice along time stay clean on both SoCs;
- a dilated conv is exact as a polyphase conv: ``[1, C, L, 1] -> [1, C, L / d, d]`` puts the
  ``d`` phases on the width, and the dilation-``d`` kernel becomes a plain ``(k, 1)`` kernel
  (0 warnings, about 1 s to compile at 122,880 samples);
- on rk3576 a ConvTranspose with a 40,962-sample input (the last block at B=64) overflows a
  14-bit field and did not finish compiling alone in 15 minutes; as ``stride`` plain phase
  convolutions met on the width it is clean and compiles in 83 s.

:class:`Code2WavNpuStep` keeps the contract, the flat cache layout and the transformer and
upsample stages of :class:`~.stateful.Code2WavStep` (whose CPU formulation it leaves alone) and
rewrites the waveform stage that way; with ``pass_frames`` it decodes long steps in passes. The
graph computes the same function (checked against the full decode in onnxruntime like every step
graph).

The attention reads and writes each layer's K/V history as one region: K and V are stacked on the head
axis (one projection, RoPE with ``cos = 1, sin = 0`` on the V half, one selection matmul for history + new
and one for the next history). With ``dynamic_input``, rknn-toolkit2 2.5.0 lowers only the first MatMul
that reads a (folded) selection constant; a second reader, the V selection of the split form, became an
``Einsum`` on the CPU with no lowering (``No lowering found for: /MatMul_N, node type = Einsum``), which
boards have refused at run time. Stacked, every selection constant has one reader.

``dynamic=True`` traces the same formulation at a symbolic B (for rknn-toolkit2's ``dynamic_input``,
one ``.rknn`` with one copy of the weights for several step sizes): masks and selection matrices
are slices of the ``step_frames`` constants, reshapes use ``-1``, and the polyphase padding is
computed from the length. The toolkit specializes each step size it is given, folding that shape
arithmetic into the constants a static graph of that size holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Attention,
    CausalConv1d,
    CausalConvTranspose1d,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
)

from ..errors import EdgeExportError
from .stateful import Code2WavStep, _CacheIO, conv_tail, shifted_eye, transpose_tail


def _snake(module: SnakeBeta, hidden: torch.Tensor) -> torch.Tensor:
    """SnakeBeta on ``[1, C, T, 1]`` (its folded constants are ``[1, C, 1]``)."""
    if module.alpha_exp is None:
        alpha_exp, beta_inv = module.constants()
    else:
        alpha_exp, beta_inv = module.alpha_exp, module.beta_inv
    return hidden + beta_inv[..., None] * torch.pow(torch.sin(hidden * alpha_exp[..., None]), 2)


class Code2WavNpuStep(Code2WavStep):
    """:class:`~.stateful.Code2WavStep` whose waveform stage runs as ``[1, C, T, 1]`` (the ``time_on_height``
    layout of :mod:`.layouts`).

    ``pass_frames``: decode the ``step_frames`` in passes of at most that many frames, one after
    another inside the graph, each reading the cache the one before wrote. The stateful step is
    exact, so the passes compute the same audio and cache as one pass (same contract, same cache
    layout), while no tensor of the graph is longer than one pass's. rknn-toolkit2 2.5.0 needs this
    for rk3576 at B=64: its compiler stops on an internal check (SIGILL) on the single-pass graph
    (docs/hardware/rockchip-npu.md). The frames split into equal passes, so one pass graph is traced
    and its constants are stored once.
    """

    waveform_phase_convolutions = True
    dynamic_is_cpu_form = False

    def __init__(
        self,
        decoder: Qwen3TTSTokenizerV2Decoder,
        step_frames: int,
        *,
        pass_frames: int | None = None,
        dynamic: bool = False,
    ):
        super().__init__(decoder, step_frames, dynamic=dynamic)
        self.pass_frames = step_frames
        self.one_pass: Code2WavNpuStep | None = None
        if pass_frames is not None and pass_frames < 1:
            raise EdgeExportError(f"pass_frames must be >= 1, found {pass_frames}")
        if pass_frames is not None and pass_frames < step_frames:
            if dynamic:  # a pass has a fixed size; a graph at a symbolic B has none to split
                raise EdgeExportError(
                    f"a step graph at a symbolic B cannot decode in passes (pass_frames={pass_frames} < "
                    f"step_frames={step_frames}); build separate static graphs per step size instead"
                )
            self.pass_frames = equal_pass_frames(step_frames, pass_frames)
            self.one_pass = Code2WavNpuStep(decoder, self.pass_frames)
        config = decoder.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        # A buffer, not computed in forward: a dynamic trace would keep that arange (Range) in the graph.
        select = shifted_eye(heads, heads, 0).reshape(heads, kv_heads, heads // kv_heads).sum(-1)
        # K and V stacked on the head axis share one grouped-head repeat: the selection twice, block-diagonal.
        self.register_buffer("select_kv_heads", torch.block_diag(select, select), persistent=False)
        # RoPE on the stacked [K; V] heads: cos/sin where the head is a key, cos = 1 and sin = 0 (V unturned,
        # exactly: v * 1 + rotated(v) * 0 = v) where it is a value.
        key_heads = torch.cat([torch.ones(kv_heads), torch.zeros(kv_heads)])[:, None, None]
        self.register_buffer("rope_key_heads", key_heads, persistent=False)
        self.register_buffer("rope_value_heads", 1.0 - key_heads, persistent=False)
        for index, layer in enumerate(decoder.pre_transformer.layers):  # one [K; V] projection per layer
            attn, key = layer.self_attn, f"pre_transformer_layers_{index}"
            weight = torch.cat([attn.k_proj.weight, attn.v_proj.weight]).detach()
            bias = None if attn.k_proj.bias is None else torch.cat([attn.k_proj.bias, attn.v_proj.bias]).detach()
            self.register_buffer(f"kv_proj_{key}_weight", weight, persistent=False)
            self.register_buffer(f"kv_proj_{key}_bias", bias, persistent=False)

    def forward(self, audio_codes, freqs_in, cache_valid, cache_in):
        if self.one_pass is None:
            return super().forward(audio_codes, freqs_in, cache_valid, cache_in)
        size, slots, pieces, cache = self.pass_frames, self.contract.kv_slots, [], cache_in
        for start in range(0, self.step_frames, size):
            # History written before this pass: cache_valid + start frames, at most the slots there are.
            valid = torch.clamp(cache_valid + float(start), min=0.0, max=float(slots))
            audio, cache = self.one_pass(
                audio_codes[:, :, start : start + size], freqs_in[start : start + size], valid, cache
            )
            pieces.append(audio.reshape(1, 1, -1, 1))  # joined on the height, like the waveform stage
        return torch.cat(pieces, dim=2).reshape(-1), cache

    def _attention(
        self,
        cache: _CacheIO,
        name: str,
        attn: Attention,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        bias: torch.Tensor,
    ) -> torch.Tensor:
        """The step's attention with K and V stacked on the head axis (``[2 * kv_heads, keys, head_dim]``).

        The cache layout keeps ``{name}.key`` and ``{name}.value`` adjacent, so the stacked history is one
        region of ``cache_in`` and the next one is written as its two halves, in layout order.
        """
        frames = -1 if self.dynamic else hidden.shape[1]  # -1: a dynamic graph keeps B symbolic
        heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        key = name.replace(".", "_")
        weight, proj_bias = getattr(self, f"kv_proj_{key}_weight"), getattr(self, f"kv_proj_{key}_bias")
        query = attn.q_proj(hidden).view(frames, heads, head_dim).transpose(0, 1)
        stacked = F.linear(hidden, weight, proj_bias).view(frames, 2 * kv_heads, head_dim).transpose(0, 1)
        half = head_dim // 2
        query = query * cos + torch.cat([query[..., half:], query[..., :half]], dim=-1) * sin_signed
        cos_kv = cos * self.rope_key_heads + self.rope_value_heads
        sin_kv = sin_signed * self.rope_key_heads
        stacked = stacked * cos_kv + torch.cat([stacked[..., half:], stacked[..., :half]], dim=-1) * sin_kv
        select_history, select_new, select_next = self._selections(hidden.shape[1])
        history = self._read_key_value(cache, name, kv_heads)
        joined = torch.matmul(select_history, history) + torch.matmul(select_new, stacked)
        following = torch.matmul(select_next, joined)
        cache.write(f"{name}.key", following[:kv_heads])
        cache.write(f"{name}.value", following[kv_heads:])
        groups = heads // kv_heads
        if groups > 1:
            joined = self._repeat_heads(joined, 2 * heads)
        keys, values = joined[:heads], joined[heads:]
        scores = torch.matmul(query, keys.transpose(1, 2)) * attn.scaling + bias
        weights = torch.softmax(scores, dim=-1)
        attended = torch.matmul(weights, values).transpose(0, 1).reshape(1, frames, heads * head_dim)
        return attn.o_proj(attended)

    @staticmethod
    def _read_key_value(cache: _CacheIO, name: str, kv_heads: int) -> torch.Tensor:
        """``{name}.key`` and ``{name}.value`` as one ``[2 * kv_heads, slots, head_dim]`` read of ``cache_in``."""
        key, value = cache.layout.entry(f"{name}.key"), cache.layout.entry(f"{name}.value")
        if value.offset != key.offset + key.numel or value.shape != key.shape:
            raise EdgeExportError(
                f"{name}: the cache layout does not keep .key and .value adjacent and alike "
                f"(key at {key.offset} {key.shape}, value at {value.offset} {value.shape}); the stacked K/V "
                "attention reads them as one region"
            )
        _, slots, head_dim = key.shape
        return cache.cache_in[key.offset : value.offset + value.numel].view(2 * kv_heads, slots, head_dim)

    def _repeat_heads(self, joined: torch.Tensor, heads: int) -> torch.Tensor:
        """Grouped ``[K; V]`` heads repeated by one constant selection matmul (repeat_interleave traces to
        Tile + Shape, expand to ConstantOfShape; two matmuls would give the constant two readers)."""
        stacked_heads, count, head_dim = joined.shape
        select = self.select_kv_heads.to(joined.dtype)
        count, width = (-1, -1) if self.dynamic else (count, count * head_dim)  # dynamic: a symbolic count of keys
        return torch.matmul(select, joined.reshape(stacked_heads, width)).reshape(heads, count, head_dim)

    def _conv_h(self, cache: _CacheIO, name: str, module: CausalConv1d, hidden: torch.Tensor) -> torch.Tensor:
        """Causal conv on ``[1, C, T, 1]``; dilation ``d > 1`` runs polyphase on ``[1, C, L / d, d]``."""
        conv = module.conv
        weight = conv.weight[..., None]  # [out, in, k, 1]
        # int(): static sizes, so the graph holds no Shape/ConstantOfShape (the step's sizes are fixed).
        tail, dilation, channels = conv_tail(module), conv.dilation[0], conv.in_channels
        frames = hidden.shape[2] if self.dynamic else int(hidden.shape[2])
        if tail == 0:
            return F.conv2d(hidden, weight, conv.bias, groups=conv.groups)
        parts = [cache.read(name)[None, :, :, None], hidden]
        joined = torch.cat(parts, dim=2)
        cache.write(name, joined[0, :, -tail:, 0])
        if dilation == 1:
            return F.conv2d(joined, weight, conv.bias, groups=conv.groups)
        if self.dynamic:
            return self._polyphase_dynamic(joined, weight, conv, frames)
        # Polyphase: sample t = q * d + p sits at [q, p]; left zeros make the length a multiple of d
        # (they only feed outputs that are cut off again).
        extra = (-frames) % dilation
        if extra:
            joined = torch.cat([torch.zeros(1, channels, extra, 1, dtype=joined.dtype), joined], dim=2)
        length = tail + frames + extra
        phases = joined.reshape(1, channels, length // dilation, dilation)
        out = F.conv2d(phases, weight, conv.bias, groups=conv.groups)
        out = out.reshape(1, conv.out_channels, frames + extra, 1)
        return out[:, :, extra:] if extra else out

    def _polyphase_dynamic(self, joined: torch.Tensor, weight: torch.Tensor, conv, frames) -> torch.Tensor:
        """The polyphase conv at a symbolic length: ``1..d`` left zeros (never none, so no step size makes
        an empty tensor), sliced from a ``d``-long constant; the cut is computed from the length too."""
        dilation, channels = conv.dilation[0], conv.in_channels
        extra = dilation - frames % dilation
        zeros = torch.zeros(1, channels, dilation, 1, dtype=joined.dtype)[:, :, :extra]
        phases = torch.cat([zeros, joined], dim=2).reshape(1, channels, -1, dilation)
        out = F.conv2d(phases, weight, conv.bias, groups=conv.groups)
        return out.reshape(1, conv.out_channels, -1, 1)[:, :, extra:]

    def _transpose_h(
        self, cache: _CacheIO, name: str, module: CausalConvTranspose1d, hidden: torch.Tensor
    ) -> torch.Tensor:
        """Causal ConvTranspose on ``[1, C, T, 1]`` as ``stride`` plain convs whose outputs meet on the width.

        Phase ``p``'s conv gives output samples ``n * stride + p`` (:func:`~.stateful.polyphase_weights`);
        concatenated on the width they are ``[1, C_out, T, stride]``, which *is* ``[1, C_out, T * stride, 1]``
        in memory. A ConvTranspose itself writes its input length into a width field the toolkit
        overflows on rk3576 (40,962 > 16,383 at B=64); these convs do not.
        """
        weight, bias = self._phase_weights(name)
        stride, out_channels, taps = module.stride, module.conv.out_channels, weight.shape[-1]
        tail = transpose_tail(module)
        samples = -1 if self.dynamic else int(hidden.shape[2]) * stride
        if tail:
            joined = torch.cat([cache.read(name)[None, :, :, None], hidden], dim=2)
            cache.write(name, joined[0, :, -tail:, 0])
            hidden = joined[:, :, tail - (taps - 1) :]
        weight = weight.reshape(stride, out_channels, weight.shape[1], taps, 1)
        biases = bias.reshape(stride, out_channels) if bias is not None else [None] * stride
        phases = [F.conv2d(hidden, weight[phase], biases[phase]) for phase in range(stride)]
        return torch.cat(phases, dim=3).reshape(1, out_channels, samples, 1)

    def _residual_h(self, cache: _CacheIO, name: str, unit: ResidualUnit, hidden: torch.Tensor) -> torch.Tensor:
        branch = self._conv_h(cache, f"{name}.conv1", unit.conv1, _snake(unit.act1, hidden))
        conv2 = unit.conv2.conv
        return hidden + F.conv2d(_snake(unit.act2, branch), conv2.weight[..., None], conv2.bias)

    def waveform(self, cache: _CacheIO, hidden: torch.Tensor) -> torch.Tensor:
        """``decoder.*`` on ``[1, C, T]`` latents with time on the height axis; returns the clamped audio, flat.

        Everything before the waveform blocks (codebooks, transformer, upsampler) is
        :class:`Code2WavStep`'s: only this part is formulated differently.
        """
        hidden = hidden[..., None]
        for index, module in enumerate(self.decoder.decoder):
            name = f"decoder.{index}"
            if isinstance(module, CausalConv1d):
                hidden = self._conv_h(cache, name, module, hidden)
            elif isinstance(module, DecoderBlock):
                hidden = _snake(module.block[0], hidden)
                hidden = self._transpose_h(cache, f"{name}.block.1", module.block[1], hidden)
                for unit_index, unit in enumerate(module.block[2:], start=2):
                    hidden = self._residual_h(cache, f"{name}.block.{unit_index}", unit, hidden)
            elif isinstance(module, SnakeBeta):
                hidden = _snake(module, hidden)
            else:  # a module this formulation does not know: refuse at trace time, never guess
                raise EdgeExportError(f"{name}: {type(module).__name__} has no time-on-height formulation")
        return torch.clamp(hidden, min=-1.0, max=1.0).reshape(-1)


def equal_pass_frames(step_frames: int, most: int) -> int:
    """The largest pass size ``<= most`` that divides ``step_frames`` into equal passes."""
    return max(size for size in range(1, min(most, step_frames) + 1) if step_frames % size == 0)
