"""The phone formulation of the stateful step: a graph ExecuTorch's XNNPACK partitioner takes whole.

The step graph written for the Rockchip compiler (:class:`~.stateful.Code2WavStep` at a static B)
left about 415 operators per method outside XNNPACK at the released geometry, each run by
ExecuTorch's portable kernels on one thread: ``expand_copy`` from the constant selection matmuls
broadcast over the heads, ``select_copy`` of the batch row of every cache tail, ``unsqueeze_copy``
of every cache read, ``mean`` over the last axis of a 3-D tensor (RMSNorm) and
``native_layer_norm`` (XNNPACK has neither), and the codebook vectors divided out of their running
sums on every call (8.4 M divisions per step at the released size). :class:`Code2WavPhoneStep`
computes the same function in forms the partitioner delegates:

- the K/V history is joined with ``cat`` and the next history is a slice along time (the CPU
  form); attention products are ``bmm`` of 3-D tensors, grouped query heads folded into rows;
- RMSNorm and LayerNorm statistics are means of a ``[1, T, C, 1]`` view over its two innermost
  axes, which XNNPACK runs as a global average pool;
- transposed convolutions run as polyphase convolutions and SnakeBeta as ``b/2 - b/2 cos(2ax)``
  (the CPU form); cache reads are views and cache tails slices along time (no ``select``);
- the codebook vectors are divided out once, when the graph is made, and kept as constants.

What stays outside is data movement of the int64 codes (one ``select`` and one ``embedding`` per
codebook) and the final join of the cache: no arithmetic. The contract, the cache layout and the
exactness checks are those of every step graph (``>= 110 dB`` stepwise against the full decode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Attention

from ..errors import EdgeExportError
from .stateful import Code2WavStep, _CacheIO


def _mean_over_channels(hidden: torch.Tensor) -> torch.Tensor:
    """``[1, T, C]`` -> ``[1, T, 1]``: the mean over channels, as a global average pool of ``[1, T, C, 1]``."""
    frames, channels = hidden.shape[1], hidden.shape[2]
    return hidden.reshape(1, frames, channels, 1).mean(dim=(2, 3), keepdim=True).reshape(1, frames, 1)


class Code2WavPhoneStep(Code2WavStep):
    """:class:`~.stateful.Code2WavStep` in the ops XNNPACK delegates (the ``xnnpack_whole`` layout of
    :mod:`.layouts`); a static step size only."""

    always_cpu_form = True

    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, step_frames: int):
        super().__init__(decoder, step_frames)
        quantizer = decoder.quantizer
        groups = (quantizer.rvq_first, quantizer.rvq_rest)
        codebooks = [layer._codebook for group in groups for layer in group.vq.layers]
        if len(codebooks) != decoder.config.num_quantizers:
            raise EdgeExportError(
                f"the quantizer holds {len(codebooks)} codebooks, the config says {decoder.config.num_quantizers}"
            )
        with torch.no_grad():
            for index, codebook in enumerate(codebooks):  # the vectors, divided out once
                self.register_buffer(f"codebook_{index}", codebook.embedding().detach().clone())
            for group in ("rvq_first", "rvq_rest"):  # the 1x1 output convolutions as linear weights
                weight = getattr(quantizer, group).output_proj.weight
                self.register_buffer(f"{group}_output_proj", weight.detach()[:, :, 0].clone())
        # Convolution weights held as buffers must be persistent: XNNPACK's lowering reshapes 1-D
        # convolution weights into new state-dict entries, which torch.export's verifier refuses for
        # a non-persistent buffer ("Non-persistent buffer ... is in the state dict").
        for name, buffer in list(self.named_buffers(recurse=False)):
            if name.startswith("polyphase_") and buffer is not None:
                self.register_buffer(name, buffer)

    def _history(self, cache: _CacheIO, name: str) -> torch.Tensor:
        entry = self.contract.layout.entry(name)
        return cache.read(name).view(1, *entry.shape)

    def _cache_tail(self, joined: torch.Tensor, tail: int) -> torch.Tensor:
        return joined[:, :, -tail:]

    def _codebooks(self, audio_codes: torch.Tensor) -> torch.Tensor:
        """Each group's lookups summed in codebook order and projected (as the quantizer), then added."""
        quantizer, codes, offset, projected = self.decoder.quantizer, audio_codes[0], 0, None
        for group in ("rvq_first", "rvq_rest"):
            summed = None
            for index in range(offset, offset + len(getattr(quantizer, group).vq.layers)):
                lookup = F.embedding(codes[index], getattr(self, f"codebook_{index}"))  # [B, dim]
                summed = lookup if summed is None else summed + lookup
                offset += 1
            out = F.linear(summed, getattr(self, f"{group}_output_proj"))  # the 1x1 conv: [B, codebook_dim]
            projected = out if projected is None else projected + out
        return projected.transpose(0, 1).reshape(1, projected.shape[1], projected.shape[0])

    def _rms_norm(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        square_mean = _mean_over_channels(hidden * hidden)
        return module.weight * (hidden * torch.rsqrt(square_mean + module.eps))

    def _layer_norm(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        centered = hidden - _mean_over_channels(hidden)
        variance = _mean_over_channels(centered * centered)
        return centered * torch.rsqrt(variance + module.eps) * module.weight + module.bias

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
        """Sliding-window attention over ``cat(history, new)``; query head ``h`` reads K/V head ``h // groups``.

        The queries of the ``groups`` heads sharing a K/V head are stacked as rows of one ``bmm``
        (``[kv_heads, groups * B, D]``), so no K/V head is repeated.
        """
        frames = hidden.shape[1]
        heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        groups, slots, half = heads // kv_heads, self.contract.kv_slots, head_dim // 2
        query = attn.q_proj(hidden).view(frames, heads, head_dim).transpose(0, 1)
        key = attn.k_proj(hidden).view(frames, kv_heads, head_dim).transpose(0, 1)
        value = attn.v_proj(hidden).view(frames, kv_heads, head_dim).transpose(0, 1)
        query = query * cos + torch.cat([query[..., half:], query[..., :half]], dim=-1) * sin_signed
        key = key * cos + torch.cat([key[..., half:], key[..., :half]], dim=-1) * sin_signed
        keys = torch.cat([cache.read(f"{name}.key"), key], dim=1)  # [kv_heads, slots + B, D]
        values = torch.cat([cache.read(f"{name}.value"), value], dim=1)
        cache.write(f"{name}.key", keys[:, -slots:])
        cache.write(f"{name}.value", values[:, -slots:])
        rows = query.reshape(kv_heads, groups * frames, head_dim)
        scores = torch.bmm(rows, keys.transpose(1, 2)) * attn.scaling
        scores = scores.view(kv_heads, groups, frames, slots + frames) + bias
        weights = torch.softmax(scores, dim=-1).view(kv_heads, groups * frames, slots + frames)
        attended = torch.bmm(weights, values).view(heads, frames, head_dim)
        return attn.o_proj(attended.transpose(0, 1).reshape(1, frames, heads * head_dim))
