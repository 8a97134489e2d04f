"""Typed errors of the 12 Hz speech tokenizer (its decoder and its encoder).

All derive from ``ValueError`` so callers that only know the standard library still catch them,
and from :class:`vllm_omni.errors.EdgeError` so the edge command lines report them as one
``error:`` line (the model code may import ``vllm_omni.errors``, not ``vllm_omni.edge``).
"""

from vllm_omni.errors import EdgeError


class DecoderConfigError(EdgeError, ValueError):
    """The speech tokenizer's config.json is missing a field or holds an impossible geometry."""


class InvalidCodesError(EdgeError, ValueError):
    """Codec codes handed to the decoder do not fit its contract (rank, codebooks, dtype, range)."""


class DecoderWeightsError(EdgeError, ValueError):
    """Checkpoint tensors that do not fit the decoder built from its config (names, shapes, values)."""


class EncoderConfigError(EdgeError, ValueError):
    """The speech tokenizer's ``encoder_config`` (a Mimi config) is missing, impossible, or disagrees with the rest."""


class EncoderWeightsError(EdgeError, ValueError):
    """Checkpoint ``encoder.*`` tensors that do not fit the encoder built from its config (names, shapes)."""


class InvalidAudioError(EdgeError, ValueError):
    """Audio handed to the encoder does not fit its contract (a non-empty, finite float32 mono array)."""
