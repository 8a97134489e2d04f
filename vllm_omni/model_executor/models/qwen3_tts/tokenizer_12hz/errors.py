"""Typed errors of the 12 Hz speech-tokenizer decoder.

All derive from ``ValueError`` so callers that only know the standard library still catch them.
"""


class DecoderConfigError(ValueError):
    """The speech tokenizer's config.json is missing a field or holds an impossible geometry."""


class InvalidCodesError(ValueError):
    """Codec codes handed to the decoder do not fit its contract (rank, codebooks, dtype, range)."""


class DecoderWeightsError(ValueError):
    """Checkpoint tensors that do not fit the decoder built from its config (names, shapes, values)."""
