"""Device-side decoder runtimes: numpy plus the runtime package of a backend (onnxruntime), never torch."""

from .stateful_decoder import InvalidFramesError, StatefulDecoder, StepRunner

__all__ = ["InvalidFramesError", "StatefulDecoder", "StepRunner"]
