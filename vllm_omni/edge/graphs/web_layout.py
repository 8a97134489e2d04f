"""The browser's formulation of the stateful step: exact on WebGPU, and the same graph on WASM.

onnxruntime-web's WebGPU provider runs each node as a WGSL shader, and WGSL guarantees ``sin`` and
``cos`` of a 32-bit float only on [-pi, pi], and there only to an absolute 2^-11; outside it, nothing.
SnakeBeta's argument ``a x`` leaves that range within the first blocks, and a Snake vocoder on this
provider has corrupted speech on real GPUs (onnxruntime#29807). :class:`Code2WavWebStep` is the CPU
form (:class:`~.stateful.Code2WavStep` at a symbolic B, rewritten for onnxruntime's kernels) with
three changes:

- **Range reduction**: an angle ``pi v`` becomes ``pi r`` with ``r = v - floor(v + 1/2)`` in
  [-1/2, 1/2]. ``r`` is exact in float32 (a nearby integer subtracted, Sterbenz), so the reduction
  adds only the rounding of one product. ``Floor`` runs on both providers.
- **No sin or cos op at all**: ``sin(pi r)`` and ``cos(pi r)`` are Taylor polynomials in ``r``
  (degrees 13 and 12; truncation below 7e-9 on [-1/2, 1/2], under float32's half-ulp at 1),
  evaluated with multiplies and adds, which WGSL rounds correctly. SnakeBeta is
  ``x + b sin(pi r)^2`` with ``v = a x / pi``; RoPE's angles (from the host in [0, 2 pi)) give
  ``cos = 1 - 2 sin(pi r)^2`` and ``sin = 2 sin(pi r) cos(pi r)`` with ``v = angle / (2 pi)``.
  Measured on SwiftShader's WebGPU at the small geometry against native onnxruntime on the same
  steps: WGSL's own ``cos`` after range reduction 74.4 dB, the polynomial in SnakeBeta alone 87.3 dB,
  in both 113.0 dB (WASM: 113 dB either way).
- **int32 codes** (``codes_dtype`` in the contract): the WebGPU provider has no int64 kernels, so
  int64 codes put the codebook lookups on the CPU, with a copy to the GPU after each. The lookups
  are one ``Gather`` from the codebooks stacked in one table (each codebook's codes offset by its
  row), summed per group and projected: no per-codebook split of the codes, which onnxruntime fuses
  into an int32 ``Split`` that WebGPU has no kernel for. Shape arithmetic (the symbolic B) stays
  int64 and on the CPU, as onnxruntime places it on every provider.

The contract is the CPU form's but for ``codes_dtype``; the cache layout, the plan and the exactness
checks are those of every step graph.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta

from .stateful import Code2WavStep

CODES_DTYPE = "int32"


def _taylor(odd: bool) -> tuple[float, ...]:
    """The coefficients of ``sin(pi r) / r`` (odd) or ``cos(pi r)`` in powers of ``r^2``, to ``r^13`` / ``r^12``."""
    return tuple((-1) ** k * math.pi ** (2 * k + odd) / math.factorial(2 * k + odd) for k in range(7))


SIN_PI, COS_PI = _taylor(odd=True), _taylor(odd=False)


def reduce_half_turns(turns: torch.Tensor) -> torch.Tensor:
    """``v - floor(v + 1/2)``: ``v`` half-turns (an angle ``pi v``) as ``r`` in [-1/2, 1/2], the same sine squared
    and, for whole turns ``v = 2 u``, the same angle."""
    return turns - torch.floor(turns + 0.5)


def _polynomial(squared: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    total = squared * coefficients[-1] + coefficients[-2]
    for coefficient in reversed(coefficients[:-2]):
        total = total * squared + coefficient
    return total


def sin_pi(reduced: torch.Tensor) -> torch.Tensor:
    """``sin(pi r)`` for ``r`` in [-1/2, 1/2], in multiplies and adds."""
    return reduced * _polynomial(reduced * reduced, SIN_PI)


def cos_pi(reduced: torch.Tensor) -> torch.Tensor:
    """``cos(pi r)`` for ``r`` in [-1/2, 1/2], in multiplies and adds."""
    return _polynomial(reduced * reduced, COS_PI)


def snake_beta_polynomial(module: SnakeBeta, hidden: torch.Tensor) -> torch.Tensor:
    """SnakeBeta, ``x + b sin(a x)^2``, as ``x + b sin(pi r)^2`` with ``r`` the reduced ``a x / pi`` half-turns."""
    sine = sin_pi(reduce_half_turns(hidden * (module.alpha_exp / math.pi)))
    return hidden + module.beta_inv * (sine * sine)


class Code2WavWebStep(Code2WavStep):
    """:class:`~.stateful.Code2WavStep` for onnxruntime-web (the ``webgpu`` layout of :mod:`.layouts`): the CPU form
    with range-reduced polynomial sines instead of sin/cos ops, and int32 codes."""

    always_cpu_form = True

    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, step_frames: int, *, dynamic: bool = False):
        super().__init__(decoder, step_frames, dynamic=dynamic)
        self.contract = dataclasses.replace(self.contract, codes_dtype=CODES_DTYPE)
        quantizer = decoder.quantizer
        self.groups = (quantizer.rvq_first, quantizer.rvq_rest)
        codebooks = [layer._codebook for group in self.groups for layer in group.vq.layers]
        size = decoder.config.codebook_size
        with torch.no_grad():  # the vectors divided out once, every codebook's rows one after another
            table = torch.cat([codebook.embedding().detach() for codebook in codebooks])
        self.register_buffer("codebook_table", table, persistent=False)
        offsets = torch.arange(len(codebooks), dtype=torch.int32)[None, :, None] * size
        self.register_buffer("codebook_offsets", offsets, persistent=False)

    def _codebooks(self, audio_codes: torch.Tensor) -> torch.Tensor:
        """One lookup of every code in the stacked table; each group's vectors summed and projected, then added."""
        lookup = F.embedding(audio_codes + self.codebook_offsets, self.codebook_table)  # [1, Q, B, dim]
        projected, start = None, 0
        for group in self.groups:
            count = len(group.vq.layers)
            summed = lookup[:, start] if count == 1 else lookup[:, start : start + count].sum(dim=1)
            out = F.linear(summed, group.output_proj.weight[:, :, 0])  # the 1x1 conv: [1, B, codebook_dim]
            projected = out if projected is None else projected + out
            start += count
        return projected.transpose(1, 2)

    def _activation(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return snake_beta_polynomial(module, hidden) if isinstance(module, SnakeBeta) else module(hidden)

    def _rotary(self, freqs_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's tables by the double-angle formulas on half the angle, ``pi r`` (``r`` the reduced half-turns)."""
        reduced = reduce_half_turns(torch.cat([freqs_in, freqs_in], dim=-1) * (0.5 / math.pi))
        sine, cosine = sin_pi(reduced), cos_pi(reduced)
        return 1.0 - 2.0 * (sine * sine), (2.0 * sine * cosine) * self.rotate_sign

    def example_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        codes, freqs, valid, cache = super().example_inputs()
        return codes.to(torch.int32), freqs, valid, cache
