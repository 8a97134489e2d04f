"""The codec geometry every layer agrees on: what one frame is and what audio it becomes (no torch).

A frame is ``num_quantizers`` codes, each in ``0 .. codebook_size - 1``; the decoder turns it into
``samples_per_frame`` samples at ``sample_rate`` Hz (released: 16 x 2048 codes -> 1920 samples at
24 kHz, 12.5 frames per second). Plans, step and window contracts, manifests, the codec stream's
start message and the stream decoders all carry these four numbers; they compare them through
:meth:`CodecGeometry.mismatches` instead of field by field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CodecGeometry:
    """``num_quantizers`` codes per frame, ``codebook_size`` ids per code, ``samples_per_frame`` at ``sample_rate``."""

    sample_rate: int
    samples_per_frame: int
    num_quantizers: int
    codebook_size: int

    @property
    def frame_rate(self) -> float:
        """Frames per second (12.5 for the released decoder)."""
        return self.sample_rate / self.samples_per_frame

    @classmethod
    def of_decoder(cls, decoder: Any, sample_rate: int) -> CodecGeometry:
        """The geometry of a loaded Code2Wav decoder (its config and total upsampling)."""
        config = decoder.config
        return cls(sample_rate, decoder.total_upsample, config.num_quantizers, config.codebook_size)

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: Any) -> CodecGeometry:
        """Read the four fields from any mapping that has them (a plan, a manifest, a start message)."""
        return cls(**{item.name: int(row[item.name]) for item in fields(cls)})

    def mismatches(self, other: Any, names: tuple[str, ...] | None = None) -> dict[str, tuple[Any, Any]]:
        """``{field: (this value, other's value)}`` for each field (of ``names``, default all) that differs.

        ``other`` is anything with the fields as attributes (another geometry, a stream's start message).
        """
        names = names or tuple(item.name for item in fields(self))
        return {
            name: (getattr(self, name), getattr(other, name))
            for name in names
            if getattr(self, name) != getattr(other, name)
        }
