"""Stateful Code2Wav step: ``B`` new frames + flat cache in, their audio + the next cache out. Exact.

Every causal convolution keeps the last ``(k - 1) * dilation`` input frames of its stage, every
causal ConvTranspose the last ``ceil((k - 1) / stride)`` input frames, and every transformer layer
its last ``sliding_window - 1`` keys (already rotated) and values. Together they are the whole
state of the decoder, so stepping through a stream gives the full decode's audio to fp32 noise.

Written the NPU-safe way (forms rknn-toolkit2 converts and runs correctly; a Concat on the K/V path
corrupted sliding-window attention on the NPU, 9.5 dB against 56.8 dB without it): the K/V history joins the
step's K/V through constant selection matmuls (no Concat on that path), masks are -100 (not -inf) on a constant relative
grid, never-written cache slots get a bias computed from ``cache_valid`` with elementwise clamps,
cos/sin are computed in-graph from host-reduced angles, the rotate-half sign is folded into sin
(no Neg), the final clamp has explicit bounds and SnakeBeta constants are folded.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    Attention,
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
    rope_inverse_frequencies,
)

from ..errors import EdgeExportError
from .step_contract import CacheLayout, StepContract

MASK_VALUE = -100.0  # exp(-100) is 0 in fp16; -inf and -3e4 leak through the NPU's fp16 softmax


def conv_tail(module: CausalConv1d) -> int:
    return module.left_pad


def transpose_tail(module: CausalConvTranspose1d) -> int:
    kernel, stride = module.conv.kernel_size[0], module.stride
    return math.ceil((kernel - 1) / stride)


def cache_layout(decoder: Qwen3TTSTokenizerV2Decoder) -> CacheLayout:
    """The flat-cache layout of ``decoder``'s geometry, in data-flow order."""
    config = decoder.config
    slots = config.sliding_window - 1
    shapes: list[tuple[str, tuple[int, ...]]] = [("pre_conv", (config.codebook_dim, conv_tail(decoder.pre_conv)))]
    for index in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            shapes.append(
                (f"pre_transformer.layers.{index}.{kind}", (config.num_key_value_heads, slots, config.head_dim))
            )
    for index, (transpose_conv, convnext) in enumerate(decoder.upsample):
        shapes.append((f"upsample.{index}.0", (config.latent_dim, transpose_tail(transpose_conv))))
        shapes.append((f"upsample.{index}.1.dwconv", (config.latent_dim, conv_tail(convnext.dwconv))))
    for index, module in enumerate(decoder.decoder):
        if isinstance(module, CausalConv1d):
            shapes.append((f"decoder.{index}", (module.conv.in_channels, conv_tail(module))))
        elif isinstance(module, DecoderBlock):
            transpose_conv = module.block[1]
            shapes.append(
                (f"decoder.{index}.block.1", (transpose_conv.conv.in_channels, transpose_tail(transpose_conv)))
            )
            for unit_index, unit in enumerate(module.block[2:], start=2):
                shapes.append(
                    (f"decoder.{index}.block.{unit_index}.conv1", (unit.conv1.conv.in_channels, conv_tail(unit.conv1)))
                )
    return CacheLayout.from_shapes([(name, shape) for name, shape in shapes if math.prod(shape) > 0])


def step_contract(decoder: Qwen3TTSTokenizerV2Decoder, step_frames: int, dynamic: bool = False) -> StepContract:
    config = decoder.config
    layout = cache_layout(decoder)
    inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta)
    return StepContract(
        step_frames=step_frames,
        cache_numel=layout.numel,
        head_dim=config.head_dim,
        kv_slots=config.sliding_window - 1,
        samples_per_frame=decoder.total_upsample,
        sample_rate=OUTPUT_SAMPLE_RATE,
        num_quantizers=config.num_quantizers,
        codebook_size=config.codebook_size,
        rope_inv_freq=tuple(float(f) for f in inv_freq),
        layout=layout,
        geometry=config.to_dict(),
        max_step_frames=step_frames if dynamic else None,
    )


@torch.no_grad()
def polyphase_weights(module: CausalConvTranspose1d) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [stride * C_out, C_in, taps], bias [stride * C_out])`` of ``module`` as phase convolutions.

    Tap ``k`` of phase ``p`` reads input frame ``n - (taps - 1 - k)`` with the transposed kernel's
    column ``p + (taps - 1 - k) * stride`` (zero where that is past the kernel).
    """
    conv, stride = module.conv, module.stride
    in_channels, out_channels, kernel = conv.weight.shape
    taps = math.ceil(kernel / stride)
    weight = conv.weight.new_zeros(stride, out_channels, in_channels, taps)
    for phase in range(stride):
        for back in range(taps):
            column = phase + back * stride
            if column < kernel:
                weight[phase, :, :, taps - 1 - back] = conv.weight[:, :, column].T
    bias = conv.bias.repeat(stride) if conv.bias is not None else None
    return weight.reshape(stride * out_channels, in_channels, taps), bias


def transpose_end(module: CausalConvTranspose1d, frames, dynamic: bool):
    """Where a causal ConvTranspose's output for ``frames`` new input frames ends (a slice bound).

    Its output (no padding) is ``(n - 1) * stride + kernel`` samples for ``n`` inputs, of which the
    new frames' audio ends ``kernel - stride`` before the end. A static graph slices at
    ``(tail + frames) * stride``; a dynamic one at that distance from the end (no shape arithmetic).
    """
    stride, tail = module.stride, transpose_tail(module)
    if not dynamic:
        return (tail + frames) * stride
    overhang = module.conv.kernel_size[0] - stride
    return -overhang if overhang > 0 else None


def shifted_eye(rows: int, cols: int, shift: int) -> torch.Tensor:
    """``float32[rows, cols]`` with ones where ``col == row + shift``."""
    row = torch.arange(rows)[:, None]
    col = torch.arange(cols)[None, :]
    return (col == row + shift).float()


class _CacheIO:
    """Reads regions of ``cache_in`` and collects the regions of ``cache_out`` in layout order."""

    def __init__(self, layout: CacheLayout, cache_in: torch.Tensor):
        self.layout = layout
        self.cache_in = cache_in
        self.written: list[tuple[str, torch.Tensor]] = []

    def read(self, name: str) -> torch.Tensor:
        entry = self.layout.entry(name)
        return self.cache_in[entry.offset : entry.offset + entry.numel].view(entry.shape)

    def write(self, name: str, value: torch.Tensor) -> None:
        self.written.append((name, value.reshape(-1)))

    def output(self) -> torch.Tensor:
        names = [name for name, _ in self.written]
        expected = [entry.name for entry in self.layout.entries]
        if names != expected:  # a bug in this module, caught at trace time
            raise EdgeExportError(f"cache written in the wrong order: {names} vs layout {expected}")
        return torch.cat([value for _, value in self.written])


class Code2WavStep(nn.Module):
    """Decodes ``step_frames`` new frames from continuous state; see :mod:`vllm_omni.edge.graphs.step_contract`."""

    # A formulation whose waveform blocks run their ConvTransposes as phase convolutions sets this
    # (the buffers ``polyphase_decoder_*`` are made for it); the dynamic CPU form makes them for all.
    waveform_phase_convolutions = False
    # A dynamic graph of this class is the CPU form (Concat K/V history, polyphase transposes, cosine
    # SnakeBeta); a formulation for a device (:mod:`.npu_layout`) keeps its own ops at a symbolic B.
    dynamic_is_cpu_form = True
    # A formulation built on the CPU form at every step size, static ones too (:mod:`.phone_layout`), sets this.
    always_cpu_form = False

    def __init__(self, decoder: Qwen3TTSTokenizerV2Decoder, step_frames: int, *, dynamic: bool = False):
        """``dynamic``: trace a graph that takes any B up to ``step_frames`` (one graph for every step size).

        Its masks and selection matrices are slices of constants built for ``step_frames``. Here a
        dynamic graph is also the CPU form (it joins the K/V history with Concat); the static graph,
        and a dynamic graph of :class:`~.npu_layout.Code2WavNpuStep`, keep the NPU-safe selection matmuls.
        """
        super().__init__()
        config = decoder.config
        if step_frames < 1:
            raise EdgeExportError(f"step_frames must be >= 1, found {step_frames}")
        if config.sliding_window < 2:
            raise EdgeExportError(f"the stateful step needs sliding_window >= 2, found {config.sliding_window}")
        decoder.precompute_snake_caches()
        self.decoder = decoder
        self.step_frames = step_frames
        self.dynamic = dynamic
        self.cpu_form = self.always_cpu_form or (dynamic and self.dynamic_is_cpu_form)
        self.contract = step_contract(decoder, step_frames, dynamic=dynamic)
        slots, frames = config.sliding_window - 1, step_frames
        keys = slots + frames
        # Constant selection matrices: history + new -> all keys; all keys -> next history.
        self.register_buffer("select_history", shifted_eye(keys, slots, 0), persistent=False)
        self.register_buffer("select_new", shifted_eye(keys, frames, -slots), persistent=False)
        self.register_buffer("select_next", shifted_eye(slots, keys, frames), persistent=False)
        # Relative grid: query i (absolute p+i) may see history slot j (absolute p-slots+j) iff j >= i,
        # and new key m iff 0 <= i - m < sliding_window.
        query = torch.arange(frames)[:, None]
        key = torch.arange(keys)[None, :]
        distance = query + slots - key
        allowed = (distance >= 0) & (distance < config.sliding_window)
        self.register_buffer("mask_grid", torch.where(allowed, 0.0, MASK_VALUE), persistent=False)
        # History slot j is unwritten iff j < slots - cache_valid: clamp(slots - j - valid, 0, 1) == 1.
        threshold = torch.cat([slots - torch.arange(slots, dtype=torch.float32), torch.zeros(frames)])
        self.register_buffer("slot_threshold", threshold, persistent=False)
        half = config.head_dim // 2
        self.register_buffer("rotate_sign", torch.cat([-torch.ones(half), torch.ones(half)]), persistent=False)
        transposes = [(f"upsample.{i}.0", pair[0]) for i, pair in enumerate(decoder.upsample)] if self.cpu_form else []
        if self.cpu_form or self.waveform_phase_convolutions:  # transposed convolutions as phase convolutions
            transposes += [
                (f"decoder.{i}.block.1", module.block[1])
                for i, module in enumerate(decoder.decoder)
                if isinstance(module, DecoderBlock)
            ]
        for name, module in transposes:
            weight, bias = polyphase_weights(module)
            self.register_buffer(f"polyphase_{name.replace('.', '_')}_weight", weight, persistent=False)
            self.register_buffer(f"polyphase_{name.replace('.', '_')}_bias", bias, persistent=False)

    # -- the ops a formulation for another delegate writes differently (:mod:`.phone_layout`) -----

    def _history(self, cache: _CacheIO, name: str) -> torch.Tensor:
        """A convolution's cached input frames as ``[1, C, tail]``."""
        return cache.read(name)[None]

    def _cache_tail(self, joined: torch.Tensor, tail: int) -> torch.Tensor:
        """The last ``tail`` frames of ``[1, C, T]``: what the cache keeps for the next step."""
        return joined[0, :, -tail:]

    def _codebooks(self, audio_codes: torch.Tensor) -> torch.Tensor:
        """``int64[1, Q, B]`` -> ``float32[1, codebook_dim, B]``."""
        return self.decoder.quantizer.decode(audio_codes)

    def _rms_norm(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module(hidden)

    def _layer_norm(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module(hidden)

    def _rotary(self, freqs_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's ``cos`` and signed ``sin`` tables ``[B, D]`` of the host's angles ``freqs_in`` (in ``[0, 2 pi)``)."""
        angles = torch.cat([freqs_in, freqs_in], dim=-1)
        return torch.cos(angles), torch.sin(angles) * self.rotate_sign

    # -- stateful pieces -------------------------------------------------------------------------

    def _conv(self, cache: _CacheIO, name: str, module: CausalConv1d, hidden: torch.Tensor) -> torch.Tensor:
        tail = conv_tail(module)
        if tail == 0:
            return module.conv(hidden)
        joined = torch.cat([self._history(cache, name), hidden], dim=-1)
        cache.write(name, self._cache_tail(joined, tail))
        return module.conv(joined)

    def _transpose(self, cache: _CacheIO, name: str, module: CausalConvTranspose1d, hidden: torch.Tensor):
        tail, stride, frames = transpose_tail(module), module.stride, hidden.shape[-1]
        if self.cpu_form:
            return self._transpose_polyphase(cache, name, module, hidden)
        end = transpose_end(module, frames, self.dynamic)
        if tail == 0:
            return module.conv(hidden)[..., :end]
        joined = torch.cat([self._history(cache, name), hidden], dim=-1)
        cache.write(name, self._cache_tail(joined, tail))
        return module.conv(joined)[..., tail * stride : end]

    def _phase_weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = name.replace(".", "_")
        return getattr(self, f"polyphase_{key}_weight"), getattr(self, f"polyphase_{key}_bias")

    def _transpose_polyphase(
        self, cache: _CacheIO, name: str, module: CausalConvTranspose1d, hidden: torch.Tensor
    ) -> torch.Tensor:
        """The CPU form of a causal ConvTranspose: one ordinary convolution per output phase, interleaved.

        Output sample ``n * stride + p`` is ``sum_j W[:, :, p + j * stride]^T x[n - j]``: a causal
        convolution of ``taps = ceil(kernel / stride)`` input frames with ``stride * C_out`` outputs
        (channel ``p * C_out + o``), whose phases are then interleaved in time. The same sums as the
        transposed convolution, but onnxruntime runs it as a blocked direct convolution (NCHWc).
        The cache keeps the tail the layout names; only the last ``taps - 1`` frames of it are read.
        """
        weight, bias = self._phase_weights(name)
        stride, out_channels, taps = module.stride, module.conv.out_channels, weight.shape[-1]
        tail = transpose_tail(module)
        if tail:
            joined = torch.cat([self._history(cache, name), hidden], dim=-1)
            cache.write(name, self._cache_tail(joined, tail))
            hidden = joined[..., tail - (taps - 1) :]
        phases = torch.nn.functional.conv1d(hidden, weight, bias)  # [1, stride * C_out, T]
        return phases.view(1, stride, out_channels, -1).permute(0, 2, 3, 1).reshape(1, out_channels, -1)

    def _convnext(self, cache: _CacheIO, name: str, block: ConvNeXtBlock, hidden: torch.Tensor) -> torch.Tensor:
        branch = self._conv(cache, f"{name}.dwconv", block.dwconv, hidden).transpose(1, 2)
        branch = block.pwconv2(block.act(block.pwconv1(self._layer_norm(block.norm, branch))))
        return hidden + (block.gamma * branch).transpose(1, 2)

    def _residual(self, cache: _CacheIO, name: str, unit: ResidualUnit, hidden: torch.Tensor) -> torch.Tensor:
        branch = self._conv(cache, f"{name}.conv1", unit.conv1, self._activation(unit.act1, hidden))
        # conv2 has kernel 1 (no tail): its conv directly, without the module's zero-width Pad
        return hidden + self._conv(cache, f"{name}.conv2", unit.conv2, self._activation(unit.act2, branch))

    def _activation(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """``module(hidden)``; in the CPU form SnakeBeta's ``b * sin(a x)^2`` becomes ``b/2 - b/2 * cos(2 a x)``.

        Equal up to float rounding, and onnxruntime's Cos costs about 0.7x its Sin (measured on
        this project's released shapes): SnakeBeta is the largest cost outside the convolutions.
        """
        if not (self.cpu_form and isinstance(module, SnakeBeta)):
            return module(hidden)
        half = module.beta_inv * 0.5
        return hidden + half - half * torch.cos(hidden * (module.alpha_exp * 2.0))

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
        frames = -1 if self.dynamic else hidden.shape[1]  # -1: a dynamic graph keeps B symbolic
        heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        query = attn.q_proj(hidden).view(frames, heads, head_dim).transpose(0, 1)
        key = attn.k_proj(hidden).view(frames, kv_heads, head_dim).transpose(0, 1)
        value = attn.v_proj(hidden).view(frames, kv_heads, head_dim).transpose(0, 1)
        half = head_dim // 2
        query = query * cos + torch.cat([query[..., half:], query[..., :half]], dim=-1) * sin_signed
        key = key * cos + torch.cat([key[..., half:], key[..., :half]], dim=-1) * sin_signed
        if self.cpu_form:  # Concat joins history and new keys; the next history is the last slots
            slots = self.select_next.shape[0]
            keys = torch.cat([cache.read(f"{name}.key"), key], dim=1)
            values = torch.cat([cache.read(f"{name}.value"), value], dim=1)
            cache.write(f"{name}.key", keys[:, -slots:])
            cache.write(f"{name}.value", values[:, -slots:])
        else:
            select_history, select_new, select_next = self._selections(hidden.shape[1])
            keys = torch.matmul(select_history, cache.read(f"{name}.key")) + torch.matmul(select_new, key)
            values = torch.matmul(select_history, cache.read(f"{name}.value")) + torch.matmul(select_new, value)
            cache.write(f"{name}.key", torch.matmul(select_next, keys))
            cache.write(f"{name}.value", torch.matmul(select_next, values))
        groups = heads // kv_heads
        if groups > 1:
            keys, values = self._repeat_kv(keys, values, groups)
        scores = torch.matmul(query, keys.transpose(1, 2)) * attn.scaling + bias
        weights = torch.softmax(scores, dim=-1)
        attended = torch.matmul(weights, values).transpose(0, 1).reshape(1, frames, heads * head_dim)
        return attn.o_proj(attended)

    def _selections(self, frames) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The selection matrices of a ``frames``-frame step: the buffers, or (dynamic) slices of them.

        With ``Bmax = step_frames``: history + new -> keys is the first ``slots + frames`` rows (and,
        for the new keys, ``frames`` columns); keys -> next history (one where ``col == row + frames``)
        is ``select_next``'s columns from ``Bmax - frames`` on. A toolkit that specializes each step
        size folds the slices back into the constants a static graph of that size holds.
        """
        if not self.dynamic:
            return self.select_history, self.select_new, self.select_next
        keys = self.select_next.shape[0] + frames
        return (
            self.select_history[:keys],
            self.select_new[:keys, :frames],
            self.select_next[:, self.step_frames - frames :],
        )

    def _repeat_kv(self, keys: torch.Tensor, values: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped-query attention: each K/V head serves ``groups`` query heads."""
        return keys.repeat_interleave(groups, dim=0), values.repeat_interleave(groups, dim=0)

    # -- the step ---------------------------------------------------------------------------------

    def forward(
        self, audio_codes: torch.Tensor, freqs_in: torch.Tensor, cache_valid: torch.Tensor, cache_in: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode one step: see the module docstring of ``step_contract`` for shapes.

        Inputs in order: audio_codes, freqs_in, cache_valid, cache_in; outputs: audio_values, cache_out.
        """
        decoder, cache = self.decoder, _CacheIO(self.contract.layout, cache_in)
        hidden = self._codebooks(audio_codes)
        hidden = self._conv(cache, "pre_conv", decoder.pre_conv, hidden).transpose(1, 2)

        transformer = decoder.pre_transformer
        cos, sin_signed = self._rotary(freqs_in)
        mask_grid, slot_threshold = self.mask_grid, self.slot_threshold
        if self.dynamic:  # the grid is relative: B frames use its first B rows and slots + B columns
            frames = audio_codes.shape[-1]
            keys = mask_grid.shape[1] - mask_grid.shape[0] + frames
            mask_grid, slot_threshold = mask_grid[:frames, :keys], slot_threshold[:keys]
        unwritten = torch.clamp(slot_threshold - cache_valid, min=0.0, max=1.0)
        bias = mask_grid + unwritten * MASK_VALUE
        hidden = transformer.input_proj(hidden)
        for index, layer in enumerate(transformer.layers):
            attended = self._attention(
                cache,
                f"pre_transformer.layers.{index}",
                layer.self_attn,
                self._rms_norm(layer.input_layernorm, hidden),
                cos,
                sin_signed,
                bias,
            )
            hidden = hidden + layer.self_attn_layer_scale(attended)
            hidden = hidden + layer.mlp_layer_scale(layer.mlp(self._rms_norm(layer.post_attention_layernorm, hidden)))
        hidden = transformer.output_proj(self._rms_norm(transformer.norm, hidden)).transpose(1, 2)

        for index, (transpose_conv, convnext) in enumerate(decoder.upsample):
            hidden = self._transpose(cache, f"upsample.{index}.0", transpose_conv, hidden)
            hidden = self._convnext(cache, f"upsample.{index}.1", convnext, hidden)
        return self.waveform(cache, hidden), cache.output()

    def waveform(self, cache: _CacheIO, hidden: torch.Tensor) -> torch.Tensor:
        """``decoder.*`` (the waveform blocks) on ``[1, C, T]`` latents; returns the clamped audio, flat.

        The part a formulation for another device replaces (:mod:`.npu_layout`).
        """
        for index, module in enumerate(self.decoder.decoder):
            name = f"decoder.{index}"
            if isinstance(module, CausalConv1d):
                hidden = self._conv(cache, name, module, hidden)
            elif isinstance(module, DecoderBlock):
                hidden = self._activation(module.block[0], hidden)
                hidden = self._transpose(cache, f"{name}.block.1", module.block[1], hidden)
                for unit_index, unit in enumerate(module.block[2:], start=2):
                    hidden = self._residual(cache, f"{name}.block.{unit_index}", unit, hidden)
            else:
                hidden = self._activation(module, hidden)
        return torch.clamp(hidden, min=-1.0, max=1.0).reshape(-1)

    def example_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        shapes = self.contract.input_shapes()
        return (
            torch.zeros(shapes["audio_codes"], dtype=torch.int64),
            torch.zeros(shapes["freqs_in"]),
            torch.zeros(shapes["cache_valid"]),
            torch.zeros(shapes["cache_in"]),
        )


class TorchStepRunner:
    """Runs a :class:`Code2WavStep` eagerly behind the runtime's ``StepRunner`` interface (tests, debugging)."""

    def __init__(self, step: Code2WavStep):
        self.step = step
        self.contract = step.contract

    def run(self, codes, freqs, cache_valid, cache):
        with torch.inference_mode():
            audio, cache_out = self.step(*(torch.from_numpy(a) for a in (codes, freqs, cache_valid, cache)))
        return audio.numpy(), cache_out.numpy()
