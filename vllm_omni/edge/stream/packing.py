"""11-bit packing of codec ids (each < 2048): about 275 bytes per second of speech instead of 400 as int16."""

from __future__ import annotations

import numpy as np

_BITS = np.arange(11, dtype=np.uint16)


def pack11(codes: np.ndarray) -> bytes:
    """Codes (each < 2048) as 11-bit fields, least significant bit first, zero-padded to a whole byte."""
    values = np.asarray(codes, dtype=np.uint16).ravel()
    bits = ((values[:, None] >> _BITS) & 1).astype(np.uint8)
    return np.packbits(bits.ravel(), bitorder="little").tobytes()


def unpack11(data: bytes, count: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little", count=11 * count)
    return (bits.reshape(count, 11).astype(np.int64) << _BITS.astype(np.int64)).sum(axis=1)
