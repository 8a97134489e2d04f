"""The code predictor with its weights fused and its passes on static buffers: few kernels per step.

:class:`~.code_predictor.Qwen3TTSCodePredictor` is the model as the checkpoint states it (and the reference
the tests hold this one to). Run eagerly, its 15 passes x 5 layers are about 4,700 ATen ops per step greedy
(6,000 sampled): on a GPU the step is bound by kernel launches, on a CPU by their overheads. This module
runs the same math with the weights rearranged once, after loading:

* q/k/v merged into one projection, gate/up into another; the RMSNorm weights before them (the layer's
  input and post-attention norms, the final norm before the heads) folded into their columns, so each norm
  is one fused normalisation without weight (``aten._fused_rms_norm``);
* q/k norm and RoPE in four ops for all heads at once: the norm weights folded into per-position cos/sin
  tables, ``rotate_half`` a roll by half the head with its sign in the sin table;
* attention with grouped KV heads as one ``scaled_dot_product_attention`` (no repeat), straight from the
  K/V buffers: every position's q/k/v is written by the projection into its own slot of a per-layer buffer
  laid out ``[position, batch, ...]``, so a pass writes its K/V where the next passes read them;
* the output and down projections added into the residual stream in place (``addmm_``);
* each codebook's embedding and the projection from the talker's width folded into one table (an
  embedding lookup written straight into the next pass's input);
* the sampled rows' random draws for all 15 codebooks made once per step (:class:`~.residual_sampler.StepDraws`).

A :class:`Workspace` holds the buffers (and every view of them a pass uses) of one batch size and dtype, so a
pass allocates little and a CUDA graph can capture :meth:`FusedCodePredictor.run` on it
(:mod:`.code_predictor_graphs`). The math is the reference's with a different rounding order (fp32 codes
equal; bf16 has fewer intermediate roundings than the official model's).

``gemm``: how a projection runs. By default ``torch.mm``/``torch.addmm`` (every platform); the engine passes
vLLM's own CPU GEMM (oneDNN with prepacked weights, ``engine_projection`` in the talker), which streams a
step's few rows about twice as fast on a CPU. ``norm``: the RMS normalisation, by default
``aten._fused_rms_norm``; the engine passes vLLM's fused kernel on a CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from .code_predictor import Qwen3TTSCodePredictor
from .residual_sampler import ResidualSampling


class Projection:
    """``y = x @ W^T (+ b)`` of one fixed weight (plain torch): into a buffer, or added into one in place."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight_t, self.bias = weight.t(), bias  # a transposed view: mm reads it without a copy

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if self.bias is None:
            torch.mm(x, self.weight_t, out=out)
        else:
            torch.addmm(self.bias, x, self.weight_t, out=out)

    def add_into(self, x: torch.Tensor, target: torch.Tensor, scratch: torch.Tensor) -> None:
        """``target += x @ W^T (+ b)``; ``scratch`` (``target``'s shape) is free to use."""
        if self.bias is None:
            target.addmm_(x, self.weight_t)
        else:
            self.into(x, scratch)
            target.add_(scratch)


GemmFactory = Callable[[torch.Tensor, "torch.Tensor | None"], Projection]
RMSNormOp = Callable[[torch.Tensor, float], torch.Tensor]  # RMS normalisation over the last dim, no weight


@dataclass
class _Layer:
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection
    # Per position p: the folded q/k norm weight times cos_p, and the permuted, signed weight times sin_p.
    rope_cos: torch.Tensor  # [positions, heads + kv_heads, head_dim]
    rope_sin: torch.Tensor


@dataclass
class _PassViews:
    """The views one layer's pass reads and writes (made once per workspace; views of fresh tensors are not)."""

    qkv_out: torch.Tensor  # [rows, qkv width]: this pass's positions in the layer's qkv buffer
    qk_heads: torch.Tensor  # [seq, B, heads + kv_heads, head_dim] of qkv_out
    roped: torch.Tensor  # [seq, B, heads + kv_heads, head_dim]: this pass's positions of the roped q/k buffer
    q: torch.Tensor  # [B, heads, seq, head_dim]
    k: torch.Tensor  # [B, kv_heads, positions so far, head_dim]
    v: torch.Tensor
    rope_cos: torch.Tensor  # [seq, 1, heads + kv_heads, head_dim]: this pass's positions of the layer's tables
    rope_sin: torch.Tensor


@dataclass
class _Rows:
    """The buffers of one pass's rows ([rows, ...]; the first pass has 2 * B, the later ones B): the residual
    stream, a scratch of its shape, and the MLP's gate/up output (with its two halves) and activation."""

    stream: torch.Tensor
    scratch: torch.Tensor
    gate_up: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    act: torch.Tensor


@dataclass
class Workspace:
    """Static buffers of one batch size and dtype: inputs, K/V, the residual stream, outputs, sampling columns."""

    batch: int
    hidden: torch.Tensor  # [B, talker hidden]: inputs
    code0: torch.Tensor  # [B, talker hidden]
    codes: torch.Tensor  # int64[B, groups - 1]: outputs
    sampling: ResidualSampling  # its tensors are static too (all_greedy False: one workspace for any mix)
    first: _Rows  # the first pass's: positions 0 and 1, position-major (2 * B rows)
    later: _Rows  # a later pass's (B rows)
    logits: torch.Tensor  # [B, vocab]
    code_columns: list[torch.Tensor] = field(default_factory=list)  # codes[:, g]
    passes: list[list[_PassViews]] = field(default_factory=list)  # [pass][layer]
    nbytes: int = 0  # of its activation buffers (the int64 codes and sampling columns are small)


class FusedCodePredictor:
    """``predict`` with the signature and the codes of :meth:`Qwen3TTSCodePredictor.predict`, from fused weights.

    Built from a loaded predictor (its device and dtype; build again after moving it). Keeps a workspace per
    batch size, at most :data:`MAX_WORKSPACES` of them and :data:`MAX_WORKSPACE_BYTES` in all, dropping the least
    recently used (the newest stays whatever its size; about 2.3 MB per row at the released sizes in fp32).
    :mod:`.code_predictor_graphs` keeps its own, one per bucket.
    """

    MAX_WORKSPACES = 8
    MAX_WORKSPACE_BYTES = 512 << 20

    def __init__(
        self, predictor: Qwen3TTSCodePredictor, gemm: GemmFactory = Projection, norm: RMSNormOp | None = None
    ) -> None:
        config = predictor.config
        self.norm = norm or rms_norm
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.groups, self.positions = config.num_code_groups - 1, config.num_code_groups
        self.eps = config.rms_norm_eps
        model = predictor.model
        weight = model.norm.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.hidden_size, self.vocab = config.hidden_size, config.vocab_size
        self.intermediate = config.intermediate_size
        self.talker_hidden = model.codec_embedding[0].weight.shape[1]
        cos, sin = predictor._rope_table(torch.float32)  # [positions, head_dim]
        half = self.head_dim // 2
        permutation = torch.cat((torch.arange(half, self.head_dim), torch.arange(half))).to(self.device)
        sign = torch.cat((-torch.ones(half), torch.ones(half))).to(self.device)
        self.layers = []
        with torch.no_grad():
            for layer in model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = torch.cat((attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight))
                qkv_bias = None
                if attn.q_proj.bias is not None:
                    qkv_bias = torch.cat((attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias))
                gate_up = torch.cat((mlp["gate_proj"].weight, mlp["up_proj"].weight))
                q_norm, k_norm = attn.q_norm.weight.float(), attn.k_norm.weight.float()
                norm = torch.cat((q_norm.expand(self.heads, -1), k_norm.expand(self.kv_heads, -1)))  # [heads + kv, dim]
                self.layers.append(
                    _Layer(
                        qkv=gemm(_fold(qkv, layer.input_layernorm.weight), qkv_bias),
                        o=gemm(attn.o_proj.weight, attn.o_proj.bias),
                        gate_up=gemm(_fold(gate_up, layer.post_attention_layernorm.weight), None),
                        down=gemm(mlp["down_proj"].weight, None),
                        rope_cos=(norm * cos[:, None]).to(self.dtype),
                        rope_sin=(norm[:, permutation] * sign * sin[:, None]).to(self.dtype),
                    )
                )
            self.heads_out = [gemm(_fold(head.weight, model.norm.weight), None) for head in predictor.lm_head]
            projection = predictor.small_to_mtp_projection
            if isinstance(projection, torch.nn.Linear):
                self.project = gemm(projection.weight, projection.bias)
                # Embedding then projection is linear in the one-hot code: one table of projected rows per codebook.
                self.tables = [F.linear(e.weight, projection.weight, projection.bias) for e in model.codec_embedding]
            else:
                self.project = None
                self.tables = [e.weight for e in model.codec_embedding]
        self.groups_index = torch.arange(self.groups, device=self.device)
        self._workspaces: OrderedDict[int, Workspace] = OrderedDict()

    # -- workspaces ---------------------------------------------------------------------------

    def workspace(self, batch: int) -> Workspace:
        """The workspace of ``batch`` rows (made on first use; the least recent dropped beyond the limit)."""
        space = self._workspaces.get(batch)
        if space is None:
            space = self._workspaces[batch] = self.new_workspace(batch)
        self._workspaces.move_to_end(batch)
        while len(self._workspaces) > 1 and (
            len(self._workspaces) > self.MAX_WORKSPACES
            or sum(s.nbytes for s in self._workspaces.values()) > self.MAX_WORKSPACE_BYTES
        ):
            self._workspaces.popitem(last=False)
        return space

    def new_workspace(self, batch: int) -> Workspace:
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        qk, width = (heads + kv) * dim, (heads + 2 * kv) * dim
        options = {"dtype": self.dtype, "device": self.device}

        allocated: list[torch.Tensor] = []

        def buffer(*shape: int) -> torch.Tensor:
            allocated.append(torch.zeros(*shape, **options))
            return allocated[-1]

        def rows(count: int) -> _Rows:
            gate_up = buffer(count, 2 * self.intermediate)
            return _Rows(
                stream=buffer(count, self.hidden_size),
                scratch=buffer(count, self.hidden_size),
                gate_up=gate_up,
                gate=gate_up[:, : self.intermediate],
                up=gate_up[:, self.intermediate :],
                act=buffer(count, self.intermediate),
            )

        device = self.device
        space = Workspace(
            batch=batch,
            hidden=buffer(batch, self.talker_hidden),
            code0=buffer(batch, self.talker_hidden),
            codes=torch.zeros(batch, self.groups, dtype=torch.int64, device=device),
            sampling=ResidualSampling(
                all_greedy=False,
                greedy=torch.ones(batch, dtype=torch.bool, device=device),
                temperature=torch.ones(batch, dtype=torch.float32, device=device),
                top_k=torch.zeros(batch, dtype=torch.int64, device=device),
                top_p=torch.ones(batch, dtype=torch.float32, device=device),
                seeds=torch.zeros(batch, dtype=torch.int64, device=device),
                frames=torch.zeros(batch, dtype=torch.int64, device=device),
            ),
            first=rows(2 * batch),
            later=rows(batch),
            logits=buffer(batch, self.vocab),
        )
        space.code_columns = list(space.codes.unbind(1))
        for index, layer in enumerate(self.layers):
            qkv = buffer(self.positions, batch, width)  # position-major: one position's rows are contiguous
            roped = buffer(self.positions, batch, heads + kv, dim)
            keys = roped[:, :, heads:].permute(1, 2, 0, 3)  # [B, kv, positions, dim]
            values = qkv[:, :, qk:].view(self.positions, batch, kv, dim).permute(1, 2, 0, 3)
            for step in range(self.groups):  # pass 0: positions 0 and 1; pass g: position g + 1
                first, last = (0, 2) if step == 0 else (step + 1, step + 2)
                views = _PassViews(
                    qkv_out=qkv[first:last].view((last - first) * batch, width),
                    qk_heads=qkv[first:last, :, :qk].view(last - first, batch, heads + kv, dim),
                    roped=roped[first:last],
                    q=roped[first:last, :, :heads].permute(1, 2, 0, 3),
                    k=keys[:, :, :last],
                    v=values[:, :, :last],
                    rope_cos=layer.rope_cos[first:last].unsqueeze(1),
                    rope_sin=layer.rope_sin[first:last].unsqueeze(1),
                )
                if index == 0:
                    space.passes.append([])
                space.passes[step].append(views)
        space.nbytes = sum(t.numel() * t.element_size() for t in allocated)
        return space

    # -- running --------------------------------------------------------------------------------

    @torch.inference_mode()
    def predict(self, talker_hidden: torch.Tensor, code0_embeds: torch.Tensor, sampling: ResidualSampling):
        """Residual codes ``int64[B, groups - 1]`` (a new tensor), as :meth:`Qwen3TTSCodePredictor.predict`."""
        space = self.workspace(talker_hidden.shape[0])
        load(space, talker_hidden.shape[0], talker_hidden, code0_embeds, sampling)
        self.run(space, sampling.all_greedy)
        return space.codes.clone()

    @torch.inference_mode()
    def run(self, space: Workspace, all_greedy: bool) -> None:
        """The 15 passes on ``space``'s inputs into ``space.codes``: no host read, no branch on values."""
        batch = space.batch
        draws = None if all_greedy else space.sampling.draws(self.groups_index, self.vocab)
        first = space.first.stream.view(2, batch, self.hidden_size)
        if self.project is None:
            first[0].copy_(space.hidden)
            first[1].copy_(space.code0)
        else:
            self.project.into(space.hidden, first[0])
            self.project.into(space.code0, first[1])
        for step in range(self.groups):
            rows = space.first if step == 0 else space.later
            for layer, views in zip(self.layers, space.passes[step], strict=True):
                self._layer(layer, views, rows, causal=step == 0)
            last = first[1] if step == 0 else rows.stream
            normed = self.norm(last, self.eps)
            self.heads_out[step].into(normed, space.logits)
            code = space.code_columns[step]
            torch.argmax(space.logits, dim=-1, out=code)
            if draws is not None:
                draws.pick(step, space.logits, code, out=code)
            if step + 1 < self.groups:
                torch.index_select(self.tables[step], 0, code, out=space.later.stream)

    def _layer(self, layer: _Layer, views: _PassViews, rows: _Rows, causal: bool) -> None:
        """One decoder layer on this pass's positions; ``rows.stream`` (the residual) updated in place."""
        stream = rows.stream
        normed = self.norm(stream, self.eps)
        layer.qkv.into(normed, views.qkv_out)
        heads = self.norm(views.qk_heads, self.eps)
        turned = torch.roll(heads, self.head_dim // 2, -1)  # rotate_half's halves swapped (its sign is in rope_sin)
        torch.addcmul(heads * views.rope_cos, turned, views.rope_sin, out=views.roped)
        attended = F.scaled_dot_product_attention(views.q, views.k, views.v, is_causal=causal, enable_gqa=True)
        if causal:  # [B, heads, 2, dim] -> position-major rows
            attended = attended.permute(2, 0, 1, 3).reshape(stream.shape[0], -1)
        else:
            attended = attended.view(stream.shape[0], -1)
        layer.o.add_into(attended, stream, rows.scratch)
        normed = self.norm(stream, self.eps)
        layer.gate_up.into(normed, rows.gate_up)
        torch.mul(F.silu(rows.gate), rows.up, out=rows.act)
        layer.down.add_into(rows.act, stream, rows.scratch)


def load(space: Workspace, rows: int, hidden: torch.Tensor, code0: torch.Tensor, sampling: ResidualSampling) -> None:
    """A step's ``rows`` frames into ``space``'s static inputs; spare rows greedy on zeros (rows never mix)."""
    space.hidden[:rows] = hidden
    space.code0[:rows] = code0
    static = space.sampling
    for name in ("greedy", "temperature", "top_k", "top_p", "seeds", "frames"):
        getattr(static, name)[:rows] = getattr(sampling, name)
    if rows < space.batch:
        space.hidden[rows:] = 0
        space.code0[rows:] = 0
        spares = {"greedy": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seeds": 0, "frames": 0}
        for name, spare in spares.items():
            getattr(static, name)[rows:] = spare


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation over the last dimension, without weight, in one op (float32 statistics)."""
    if _FUSED_RMS_NORM is not None:
        return _FUSED_RMS_NORM(x, [x.shape[-1]], None, eps)[0]
    return F.rms_norm(x, (x.shape[-1],), None, eps)  # an older torch: the same math in a few ops


_FUSED_RMS_NORM = getattr(torch.ops.aten, "_fused_rms_norm", None)


def _fold(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] with an RMSNorm's per-input scale folded in: ``W (w * x) = (W diag(w)) x``."""
    return (weight.float() * norm_weight.float()).to(weight.dtype)
