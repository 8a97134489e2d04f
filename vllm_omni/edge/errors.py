"""Typed errors of the edge subsystem. Messages say what was expected, what was found, what to do.

Every layer raises its own subclass of :class:`EdgeError` (plans ``ExecPlanError``, streams
``CodecStreamError``, builds ``EdgeExportError``, checkpoints ``CheckpointError``, the client
``ClientError``); the decoder model's errors derive from it too (see :mod:`vllm_omni.errors`).
"""

from vllm_omni.errors import EdgeError

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ClientError",
    "EdgeError",
    "EdgeExportError",
    "InvalidFramesError",
]


class CheckpointError(EdgeError):
    """A checkpoint directory is missing, incomplete or does not match the decoder geometry."""


class CheckpointNotFoundError(CheckpointError):
    """Neither a local checkpoint directory nor a reachable hub id."""


class EdgeExportError(EdgeError):
    """Exporting, lowering or verifying an artifact failed."""


class ClientError(EdgeError):
    """The edge client could not reach, read or write what it was given (network, files, interruption)."""


class InvalidFramesError(EdgeError, ValueError):
    """Codec frames that do not fit a contract (shape, dtype, count, range), refused before any state changes.

    The one class for frames handed to a decoder (:func:`vllm_omni.edge.runtime.check_frames`) and to the
    codec-stream encoder; both packages export it.
    """
