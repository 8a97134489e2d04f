"""Picking the codes of a batch of frames on the device (codebook 0, then the residual codes), each row with its
own settings.

Greedy rows take the argmax. Sampled rows follow the official warper order (temperature, top-k,
top-p over the ascending cumulative probability, as transformers' ``TopPLogitsWarper``), then draw
with the Gumbel-max trick: ``argmax(scores + g)`` with ``g = -log(-log(u))`` picks code ``c`` with
probability ``softmax(scores)[c]``. The uniforms ``u`` are counter-based: a hash (splitmix64) of
(request seed, frame index, codebook, code), computed with int64 tensor ops on the logits' device.
So a sampled frame is a function of its request's seed and its own index alone: the same whether
the request runs alone, batched with any others, preempted and resumed, on CPU or on a GPU; no
``torch.Generator`` and no global RNG are involved. Everything is float32 or int64 (no float64, which
some devices lack and consumer GPUs run slowly), and nothing is read back to the host, so a step's
passes queue on the device without a stall and can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# splitmix64 (Steele, Lea, Flood 2014) constants, as signed int64 (torch has no uint64 arithmetic).
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15
_MIX1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_MIX2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch shifts signed values arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finalizer of ``x + golden`` (int64, wrapping arithmetic): a well-mixed 64-bit hash."""
    z = x + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


# The largest float32 below 1: the top of the uniforms' range.
_BELOW_ONE = 1.0 - 2.0**-24


def unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """int64 hashes -> float32 uniforms in (0, 1): the top 24 bits (a float32's precision), centred in their
    interval. The top value's centre, 2^24 - 0.5, is no float32 (it rounds to 2^24, which would make u = 1 and its
    Gumbel noise infinite: NaN on a code filtered to -inf, which argmax then picks): it is the largest float32
    below 1 instead."""
    return ((_shift_right(bits, 40).to(torch.float32) + 0.5) * 2.0**-24).clamp_(max=_BELOW_ONE)


def counter_uniforms(keys: torch.Tensor, width: int) -> torch.Tensor:
    """``float32[*keys.shape, width]`` uniforms in (0, 1), never 0 or 1, a pure function of each int64 ``key`` and
    the column (:func:`unit_interval` of their hash)."""
    columns = torch.arange(width, dtype=torch.int64, device=keys.device)
    return unit_interval(splitmix64(splitmix64(keys).unsqueeze(-1) + columns))


def gumbel_noise(keys: torch.Tensor, width: int) -> torch.Tensor:
    """``-log(-log(u))`` of :func:`counter_uniforms`: the Gumbel-max trick's noise, finite everywhere."""
    return -torch.log(-torch.log(counter_uniforms(keys, width)))


# The key group of codebook 0 (residual codebook ``g`` uses group ``g - 1``; groups are below 64).
CODEBOOK0_GROUP = 63


def row_keys(seeds: torch.Tensor, frames: torch.Tensor, group: int | torch.Tensor) -> torch.Tensor:
    """One int64 key per row for (seed, frame index, ``group``: residual codebook ``group + 1``, or
    :data:`CODEBOOK0_GROUP`); ``group`` a tensor of groups gives ``[B, groups]`` keys (every group's at once)."""
    if isinstance(group, torch.Tensor):
        return splitmix64((splitmix64(seeds) + frames * 64).unsqueeze(1) + group)
    return splitmix64(splitmix64(seeds) + frames * 64 + group)


@dataclass(frozen=True)
class ResidualSampling:
    """Per-row settings of one batch of frames, as tensors on the logits' device (rows = frames).

    ``all_greedy``: every row is greedy (a host bool, so picking never reads the device; False is always
    correct, it only costs the sampling work); ``greedy`` bool[B]; ``temperature``, ``top_p`` float32[B];
    ``top_k`` int64[B] (0: off); ``seeds`` int64[B] (the request's); ``frames`` int64[B] (each row's frame
    index in its request).
    """

    all_greedy: bool
    greedy: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    frames: torch.Tensor

    def pick(self, group: int, logits: torch.Tensor) -> torch.Tensor:
        """``int64[B]`` codes of residual codebook ``group + 1`` (codebook 0 for :data:`CODEBOOK0_GROUP`) from
        ``logits [B, codebook]``."""
        chosen = logits.argmax(dim=-1)
        if self.all_greedy:
            return chosen
        return self.draws(group, logits.shape[-1]).pick(0, logits, chosen)

    def draws(self, groups: torch.Tensor | int, width: int) -> StepDraws:
        """Everything the sampled rows of ``groups`` (int64[G] on the device, or one group) need that the logits do
        not decide, made once (no host-to-device copy: a group number is added as a Python scalar)."""
        keys = row_keys(self.seeds, self.frames, groups)
        keys = keys if isinstance(groups, torch.Tensor) else keys.unsqueeze(1)
        k = torch.where((self.top_k > 0) & (self.top_k < width), self.top_k, torch.full_like(self.top_k, width))
        return StepDraws(
            greedy=self.greedy,
            temperature=self.temperature.clamp(min=1e-5).unsqueeze(1),
            kth_index=(width - k).unsqueeze(1),
            tail=(1 - self.top_p).unsqueeze(1),
            gumbel=gumbel_noise(keys, width),
        )


@dataclass(frozen=True)
class StepDraws:
    """The sampling inputs of several codebooks of one batch, made before any of their logits exist (one step's
    random draws at once, not one codebook at a time): per row ``greedy`` bool[B], ``temperature`` (clamped),
    ``kth_index`` (the ascending position of the top-k threshold) and ``tail`` (``1 - top_p``) as [B, 1] columns,
    and ``gumbel`` float32[B, G, codebook], codebook ``g``'s noise at ``[:, g]``."""

    greedy: torch.Tensor
    temperature: torch.Tensor
    kth_index: torch.Tensor
    tail: torch.Tensor
    gumbel: torch.Tensor

    def pick(self, index: int, logits: torch.Tensor, chosen: torch.Tensor, out: torch.Tensor | None = None):
        """Codes from ``logits [B, codebook]`` with the noise at ``index``: ``chosen`` (the argmax) on greedy rows,
        a draw on the others (into ``out`` when given)."""
        scores = logits.float() / self.temperature
        ascending, order = torch.sort(scores, dim=-1)
        # top-k: keep scores >= the k-th largest (k = 0 or >= width: keep all), as transformers' TopKLogitsWarper.
        ascending.masked_fill_(ascending < ascending.gather(1, self.kth_index), float("-inf"))
        # top-p: drop the low tail whose cumulative probability is <= 1 - top_p; the best code always stays.
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= self.tail
        drop[:, -1] = False
        ascending.masked_fill_(drop, float("-inf"))
        filtered = torch.empty_like(scores).scatter_(1, order, ascending)
        sampled = (filtered + self.gumbel[:, index]).argmax(dim=-1)
        return torch.where(self.greedy, chosen, sampled, out=out)
