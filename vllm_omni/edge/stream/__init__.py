"""The codec-token stream: codec frames from the server to a device, as versioned messages (numpy only).

Split by concern: :mod:`.messages`, :mod:`.packing`, :mod:`.encoder`, :mod:`.parser`, :mod:`.recording`,
:mod:`.errors`; everything public is re-exported here.

Three kinds of message (docs/serving/codec_stream.md has the byte layout and examples):

- **start** (JSON text): protocol name and version, codebooks, codebook size, frame rate, sample
  rate, the packing of the codes, the largest frame count per message, the hardware class and
  the plan's id (or the plan itself);
- **frames** (binary): a 12-byte little-endian header, then the codes frame-major::

      offset 0  u8   version (1)
             1  u8   flags: 0x01 end of stream, 0x02 segment end, 0x04 reset (other bits must be 0)
             2  u16  frame count T (1 .. max_frames_per_message; 0 only with a flag set)
             4  u32  sequence number (0, 1, 2, ... per stream)
             8  u32  index of the message's first frame in the stream
            12  ...  T x Q codes: int16 little-endian, or 11-bit packed (LSB first, zero-padded to a byte)

- **done** (JSON text): total frames, last sequence number, reason (``complete``, ``cancelled``,
  ``error``) and an error text.

Semantics of the flags, which the edge client applies: ``reset`` drops the decoder's state and
any frames not yet decoded *before* this message's frames (a new utterance: no stale audio);
``segment end`` flushes the decoder *after* them (the segment's audio is complete, the next one
starts fresh); ``end of stream`` also flushes, and nothing may follow but ``done``.

On a byte stream (a recorded file, an HTTP body) every message is framed as one kind byte
(``J`` JSON, ``B`` binary), a u32 little-endian length and the payload; a recording starts with
the 4-byte magic ``QCS\\x01``. :class:`CodecStreamParser` takes any bytes and returns a typed
event or raises a typed :class:`CodecStreamError`; every length is checked against a limit
before anything is allocated.
"""

from .encoder import CodecStreamEncoder, message_batches
from .errors import (
    BadVersionError,
    CodecStreamError,
    CodesOutOfRangeError,
    DuplicateMessageError,
    FramesAfterEndError,
    InvalidFramesError,
    MalformedMessageError,
    OversizedMessageError,
    SequenceGapError,
    TooManyFramesError,
    TruncatedMessageError,
    TruncatedStreamError,
)
from .messages import (
    DONE_REASONS,
    FLAG_END_OF_STREAM,
    FLAG_RESET,
    FLAG_SEGMENT_END,
    HEADER,
    KIND_BINARY,
    KIND_JSON,
    KNOWN_FLAGS,
    MAX_FRAMES_PER_MESSAGE,
    MAX_MESSAGE_BYTES,
    PACKINGS,
    PROTOCOL,
    PROTOCOL_VERSION,
    RECORD_HEADER,
    RECORDING_MAGIC,
    SOCKET_PATH,
    FrameBatch,
    SessionLimits,
    StreamDone,
    StreamStart,
)
from .packing import pack11, unpack11
from .parser import CodecStreamParser
from .recording import encode_recording, iter_events, read_records, record

__all__ = [
    "DONE_REASONS",
    "FLAG_END_OF_STREAM",
    "FLAG_RESET",
    "FLAG_SEGMENT_END",
    "HEADER",
    "KIND_BINARY",
    "KIND_JSON",
    "KNOWN_FLAGS",
    "MAX_FRAMES_PER_MESSAGE",
    "MAX_MESSAGE_BYTES",
    "PACKINGS",
    "PROTOCOL",
    "PROTOCOL_VERSION",
    "RECORDING_MAGIC",
    "RECORD_HEADER",
    "SOCKET_PATH",
    "BadVersionError",
    "CodecStreamEncoder",
    "CodecStreamError",
    "CodecStreamParser",
    "CodesOutOfRangeError",
    "DuplicateMessageError",
    "FrameBatch",
    "FramesAfterEndError",
    "InvalidFramesError",
    "MalformedMessageError",
    "OversizedMessageError",
    "SequenceGapError",
    "SessionLimits",
    "StreamDone",
    "StreamStart",
    "TooManyFramesError",
    "TruncatedMessageError",
    "TruncatedStreamError",
    "encode_recording",
    "iter_events",
    "message_batches",
    "pack11",
    "read_records",
    "record",
    "unpack11",
]
