"""Typed errors of the codec-token stream: one class per way a message or stream can break the protocol."""

from __future__ import annotations

from ..errors import EdgeError
from ..errors import InvalidFramesError as InvalidFramesError  # frames no message can carry: the edge's one class


class CodecStreamError(EdgeError):
    """A message or stream breaks the protocol. Subclasses say how."""


class MalformedMessageError(CodecStreamError):
    """Not JSON, wrong type, missing or mistyped fields, a message out of order."""


class BadVersionError(CodecStreamError):
    """A protocol version this parser does not speak."""


class TruncatedMessageError(CodecStreamError):
    """A message shorter than its header says."""


class OversizedMessageError(CodecStreamError):
    """A message longer than its header says, or than the limits allow."""


class TooManyFramesError(CodecStreamError):
    """A frame count over the stream's ``max_frames_per_message``."""


class CodesOutOfRangeError(CodecStreamError):
    """A code outside ``0 .. codebook_size - 1``."""


class SequenceGapError(CodecStreamError):
    """Messages are missing: the sequence number jumped."""


class DuplicateMessageError(CodecStreamError):
    """A sequence number already seen (a retransmission); the message is ignored."""


class FramesAfterEndError(CodecStreamError):
    """Frames after the end-of-stream flag or the done message."""


class TruncatedStreamError(CodecStreamError):
    """The byte stream ended inside a message, or before the done message."""
