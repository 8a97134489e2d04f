"""A random-weight checkpoint whose decode is near silent (RMS about 1e-8) by cancellation, not by scale.

Scaling the final conv down scales float32 rounding with it (the SNR of a correct graph stays
about 115 dB). Here the last decoder block carries channel 1 as an exact copy of channel 0 and
the final conv weighs them +w and -w (the other channels 1e-7 w): the full decode is near
silent, while the rounding of the O(1) activations that cancel is not. A correct step graph then
differs from it by about 1e-8: a low SNR, an inaudible error (issue 26). RANDOM WEIGHTS.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_near_silent_checkpoint(
    out: str | os.PathLike[str], geometry: str = "small", seed: int = 0, residual_gain: float = 1e-7
) -> Path:
    """Write the near-silent checkpoint at ``out`` and return its directory.

    ``residual_gain`` scales the final conv's other channels: the signal left over the cancellation.
    """
    from .make_checkpoint import GEOMETRIES, decoder_shapes, write_checkpoint
    from .random_weights import random_decoder_state

    config = GEOMETRIES[geometry]()
    state = random_decoder_state(decoder_shapes(config), seed=seed, num_quantizers=config.num_quantizers)
    blocks = len(config.upsample_rates)  # decoder.0 conv, decoder.1..blocks, then SnakeBeta and the final conv
    block, snake, final = f"decoder.{blocks}.block", f"decoder.{blocks + 1}", f"decoder.{blocks + 2}.conv"
    copies = [(f"{block}.1.conv.weight", 1), (f"{block}.1.conv.bias", 0), (f"{snake}.alpha", 0), (f"{snake}.beta", 0)]
    for unit in (2, 3, 4):  # the residual units: each SnakeBeta and conv row of channel 1 as channel 0's
        for name in ("act1.alpha", "act1.beta", "act2.alpha", "act2.beta"):
            copies.append((f"{block}.{unit}.{name}", 0))
        for conv in ("conv1.conv", "conv2.conv"):
            copies += [(f"{block}.{unit}.{conv}.weight", 0), (f"{block}.{unit}.{conv}.bias", 0)]
    for name, dim in copies:
        state[name].select(dim, 1).copy_(state[name].select(dim, 0))
    weight = state[f"{final}.weight"]  # [1, channels, kernel]
    weight[0, 2:] *= residual_gain
    weight[0, 1] = -weight[0, 0]
    state[f"{final}.bias"].zero_()
    return write_checkpoint(out, geometry, seed, decoder_state=state)
