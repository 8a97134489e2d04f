"""Device-side stream decoding: numpy plus the runtime package of a backend, never torch in this package.

:func:`open_decoder` turns an execution plan into a :class:`StreamDecoder` (one ``feed`` /
``flush`` / ``reset`` interface for every class): :class:`StatefulDecoder` over step runners,
:class:`WindowedDecoder` over window runners. The backends that open runners are looked up in
:mod:`vllm_omni.edge.backends.registry`; the ExecuTorch Python runtime takes torch tensors, so
that backend imports torch itself when it opens a program.
"""

from .frames import InvalidFramesError, check_frames
from .open import open_decoder
from .protocol import StreamDecoder
from .stateful_decoder import StatefulDecoder
from .windowed_decoder import WindowedDecoder

__all__ = [
    "InvalidFramesError",
    "StatefulDecoder",
    "StreamDecoder",
    "WindowedDecoder",
    "check_frames",
    "open_decoder",
]
