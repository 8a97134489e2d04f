"""Typed errors of the edge subsystem. Messages say what was expected, what was found, what to do."""


class EdgeError(Exception):
    """Base of every error the edge subsystem raises on purpose."""


class CheckpointError(EdgeError):
    """A checkpoint directory is missing, incomplete or does not match the decoder geometry."""


class CheckpointNotFoundError(CheckpointError):
    """Neither a local checkpoint directory nor a reachable hub id."""


class EdgeExportError(EdgeError):
    """Exporting, lowering or verifying an artifact failed."""
