"""Device-side decoder runtimes: numpy plus the runtime package of a backend (onnxruntime, ExecuTorch), never
torch for the stateful path (the ExecuTorch Python runtime takes torch tensors, so it imports torch itself)."""

from .frames import InvalidFramesError, check_frames
from .stateful_decoder import StatefulDecoder, StepRunner
from .windowed_decoder import WindowedDecoder, WindowRunner

__all__ = ["InvalidFramesError", "StatefulDecoder", "StepRunner", "WindowRunner", "WindowedDecoder", "check_frames"]
