"""Synthetic codec frames for tests, demos and benchmarks (no talker is available offline)."""

from __future__ import annotations

import torch


def random_codes(frames: int, num_quantizers: int = 16, codebook_size: int = 2048, seed: int = 0) -> torch.Tensor:
    """Seeded uniform codes ``int64[1, num_quantizers, frames]``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, codebook_size, (1, num_quantizers, frames), generator=generator)
