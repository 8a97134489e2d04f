"""Random-weight checkpoints that differ in how hard they drive the waveform stage (fp16 studies).

fp16 precision of the decoder depends on the weights, not on the output level (fp16 is scale
invariant; a louder final conv leaves the SNR where it was). What sets it is how far the
waveform blocks (``decoder.1..4``) drive SnakeBeta into its nonlinear range: the error gain of
``sin(alpha * x) ** 2`` grows with ``|alpha * x|``. :func:`write_checkpoint`'s weights drive it
hard (the ``hot`` checkpoint, fp16 ceiling about 47 dB, output RMS 0.07); ``moderate`` scales the
blocks' convolutions by ``block_gain`` and rescales the final conv to a loud ``output_rms``
(fp16 ceiling about 57 dB at the small geometry). RANDOM WEIGHTS either way; real weights are a
third distribution.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DRIVES = ("hot", "moderate")
_BLOCK_CONV = re.compile(r"^decoder\.[1-4]\..*weight$")


def write_drive_checkpoint(
    out: str | os.PathLike[str],
    geometry: str = "small",
    drive: str = "moderate",
    seed: int = 1,
    block_gain: float = 0.5,
    output_rms: float = 0.3,
    talker: str | None = None,
) -> Path:
    """Write a ``drive`` checkpoint (``hot``: :func:`write_checkpoint`'s weights) and return its directory.

    ``talker``: also a random-weight talker of that geometry (``write_checkpoint``'s ``talker``).
    """
    import torch

    from vllm_omni.edge.errors import EdgeError

    from .make_checkpoint import GEOMETRIES, decoder_shapes, write_checkpoint
    from .random_weights import random_decoder_state

    if drive not in DRIVES:
        raise EdgeError(f"unknown drive {drive!r}; known: {', '.join(DRIVES)}")
    config = GEOMETRIES[geometry]()
    state = random_decoder_state(decoder_shapes(config), seed=seed, num_quantizers=config.num_quantizers)
    if drive == "hot":
        return write_checkpoint(out, geometry, seed, decoder_state=state, talker=talker, drive=drive)
    last = max((name for name in state if re.match(r"^decoder\.\d+\.conv\.weight$", name)), key=_index)
    for name, tensor in state.items():
        if _BLOCK_CONV.match(name) and tensor.dim() == 3:
            tensor.mul_(block_gain)
    path = write_checkpoint(out, geometry, seed, decoder_state=state)
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    decoder = load_code2wav_decoder(path)
    codes = torch.randint(
        0, config.codebook_size, (1, config.num_quantizers, 16), generator=torch.Generator().manual_seed(7)
    )
    with torch.inference_mode():
        rms = float(decoder(codes).square().mean().sqrt())
    state[last].mul_(output_rms / max(rms, 1e-6))  # loud output: its level does not move the fp16 SNR
    return write_checkpoint(out, geometry, seed, decoder_state=state, talker=talker)


def _index(name: str) -> int:
    return int(name.split(".")[1])
