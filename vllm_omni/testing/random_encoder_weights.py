"""Random but non-trivial weights for the speech tokenizer's encoder (Mimi encoder + split RVQ), by tensor name.

Works on a ``{name: shape}`` map with encoder-relative names (the checkpoint layout less ``encoder.``, see
``tokenizer_12hz.encoder_layout.encoder_state_shapes``), so it needs neither transformers nor the modules.
The goals, as for the decoder's random weights:

* every tensor is non-trivial: LayerNorms and LayerScales differ from their init, and each codebook's
  ``cluster_usage`` differs from 1, so a wrong formula (a missing division of ``embed_sum`` by the usage)
  changes the codes and cannot hide;
* the codes vary: transformers initialises ``embed_sum`` to zeros (every frame would be code 0). Here the
  codebook vectors (``embed_sum / cluster_usage``) are Gaussian at about the spread of the projected frames
  they quantize, and the first conv amplifies speech-level input, so what changes from frame to frame
  outweighs what the biases and activations add to every frame: the nearest entry depends on the frame in
  every codebook, the semantic one included (on the voice fixtures, 22 of 56 frames differ in codebook 0 at
  the released geometry, 210 of 2230 at the small one; 50+ of 56 in the residual codebooks).

Numbers measured with these weights show agreement between implementations, not codec quality.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch

_CODEBOOK = re.compile(r"^(?P<prefix>.*\.codebook)\.(?P<field>initialized|cluster_usage|embed_sum)$")
_RESIDUAL_OUT = re.compile(r"^encoder\.layers\.\d+\.block\.3\.conv\.weight$")
# Per-dimension spread of codebook vectors: the spread of the projected frames these weights make from speech
# at about -20 dBFS (0.21..0.26 at both geometries).
CODEBOOK_STD = 0.25
BIAS_STD = 0.05
LAYER_SCALE = (0.05, 0.3)
# Gain of the first conv over the fan-in scaled default: with gain 1, speech at -20 dBFS moves the frames by a
# quarter of the constant the biases and activations add, and codebook 0 takes two values in 56 frames.
INPUT_GAIN = 5.0


def random_encoder_state(shapes: Mapping[str, Sequence[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 tensors for every name in ``shapes`` (encoder-relative names), deterministic in ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        codebook = _CODEBOOK.match(name)
        if codebook and codebook["field"] == "initialized":
            state[name] = torch.ones(shape)
        elif codebook and codebook["field"] == "cluster_usage":
            state[name] = 0.5 + 1.5 * torch.rand(shape, generator=generator)
        elif codebook:
            usage_name = f"{codebook['prefix']}.cluster_usage"
            usage = state.get(usage_name)
            if usage is None:
                usage = state[usage_name] = 0.5 + 1.5 * torch.rand(tuple(shapes[usage_name]), generator=generator)
            state[name] = CODEBOOK_STD * torch.randn(shape, generator=generator) * usage[:, None]
        elif name.endswith("layer_scale.scale"):
            low, high = LAYER_SCALE
            state[name] = low + (high - low) * torch.rand(shape, generator=generator)
        elif len(shape) == 1 and "layernorm" in name and name.endswith(".weight"):
            state[name] = 0.8 + 0.4 * torch.rand(shape, generator=generator)
        elif len(shape) == 1:  # biases, including LayerNorm's
            state[name] = BIAS_STD * torch.randn(shape, generator=generator)
        else:
            gain = 0.3 if _RESIDUAL_OUT.match(name) else INPUT_GAIN if name == "encoder.layers.0.conv.weight" else 1.0
            state[name] = gain / math.sqrt(math.prod(shape[1:])) * torch.randn(shape, generator=generator)
    return state
