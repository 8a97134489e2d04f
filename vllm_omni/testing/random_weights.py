"""Random but non-trivial Code2Wav weights, chosen by tensor name, for tests and demos.

Works on a ``{name: shape}`` map with decoder-relative names (the checkpoint layout less the
``decoder.`` prefix), so it fills our module and the official one alike. The goals:

* every tensor is non-trivial: norms, LayerScales, ConvNeXt gamma, SnakeBeta alpha/beta and
  codebook ``cluster_usage`` all differ from their identity/constant init, so a wrong formula
  (a missing division by usage, a missing exp) changes the output and cannot hide;
* activations stay O(1) through the network (fan-in scaled weights, damped residual branches), so
  the audio is not saturated: most samples lie well inside the final clamp to [-1, 1].

Numbers measured with these weights are "random weights" numbers: they show agreement between
implementations and runtimes, not audio quality.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch

# ConvTranspose weights are [in, out, kernel]; each output sample sums in * kernel / stride taps.
_UPSAMPLE_TRANSPOSE = re.compile(r"^upsample\.\d+\.0\.conv\.weight$")  # kernel == stride
_DECODER_TRANSPOSE = re.compile(r"^decoder\.\d+\.block\.1\.conv\.weight$")  # kernel == 2 * stride
_RESIDUAL_OUT = re.compile(r"\.conv2\.conv\.weight$")
_CODEBOOK = re.compile(r"^(?P<prefix>.*\._codebook)\.(?P<field>cluster_usage|embedding_sum)$")


def _uniform(generator: torch.Generator, shape: Sequence[int], low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(tuple(shape), generator=generator)


def _normal(generator: torch.Generator, shape: Sequence[int], std: float) -> torch.Tensor:
    return std * torch.randn(tuple(shape), generator=generator)


def random_decoder_state(
    shapes: Mapping[str, Sequence[int]], seed: int = 0, num_quantizers: int = 16, output_gain: float = 0.08
) -> dict[str, torch.Tensor]:
    """Random float32 tensors for every name in ``shapes`` (decoder-relative names), deterministic in ``seed``.

    ``output_gain`` scales the final conv; it sets the loudness of the decoded noise.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    last_conv = _last_conv_weight(shapes)
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        codebook = _CODEBOOK.match(name)
        if codebook and codebook["field"] == "cluster_usage":
            state[name] = _uniform(generator, shape, 0.5, 2.0)
        elif codebook:
            usage_name = f"{codebook['prefix']}.cluster_usage"
            usage = state.get(usage_name)
            if usage is None:
                usage = state[usage_name] = _uniform(generator, shapes[usage_name], 0.5, 2.0)
            # embedding = embedding_sum / usage ~ N(0, 1/sqrt(Q)): the Q lookups sum to O(1).
            state[name] = _normal(generator, shape, 1.0 / math.sqrt(num_quantizers)) * usage[:, None]
        elif name.endswith((".alpha", ".beta")):
            state[name] = _uniform(generator, shape, -0.5, 0.5)
        elif name.endswith(("layer_scale.scale", ".gamma")):
            state[name] = _uniform(generator, shape, 0.05, 0.3)
        elif len(shape) == 1 and "norm" in name and name.endswith(".weight"):
            state[name] = _uniform(generator, shape, 0.8, 1.2)
        elif len(shape) == 1:  # biases, including LayerNorm's
            state[name] = _normal(generator, shape, 0.05)
        else:
            state[name] = _normal(
                generator, shape, _weight_gain(name, last_conv, output_gain) / math.sqrt(_fan_in(name, shape))
            )
    return state


def _fan_in(name: str, shape: tuple[int, ...]) -> int:
    if _UPSAMPLE_TRANSPOSE.match(name):
        return shape[0]
    if _DECODER_TRANSPOSE.match(name):
        return 2 * shape[0]
    return math.prod(shape[1:])


def _weight_gain(name: str, last_conv: str | None, output_gain: float) -> float:
    if name == last_conv:
        return output_gain
    if _RESIDUAL_OUT.search(name):
        return 0.3
    if _DECODER_TRANSPOSE.match(name):
        return 0.7
    return 1.0


def _last_conv_weight(shapes: Mapping[str, Sequence[int]]) -> str | None:
    indices = [int(m[1]) for n in shapes if (m := re.match(r"^decoder\.(\d+)\.conv\.weight$", n))]
    return f"decoder.{max(indices)}.conv.weight" if indices else None
