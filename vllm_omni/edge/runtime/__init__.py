"""Device-side decoder runtimes: numpy plus the runtime package of a backend (onnxruntime, ExecuTorch, rknnlite),
never torch for the stateful path (the ExecuTorch Python runtime takes torch tensors, so it imports torch itself).

``open_decoder(plan)`` (:mod:`.plan_decoder`) is the entry point: one ``feed`` / ``flush`` / ``reset``
decoder for whatever the plan describes."""

from .frames import InvalidFramesError, check_frames
from .plan_decoder import open_decoder
from .stateful_decoder import StatefulDecoder, StepRunner
from .windowed_decoder import WindowedDecoder, WindowRunner

__all__ = [
    "InvalidFramesError",
    "StatefulDecoder",
    "StepRunner",
    "WindowRunner",
    "WindowedDecoder",
    "check_frames",
    "open_decoder",
]
