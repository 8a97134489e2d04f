"""The edge's typed errors: one class per meaning, whichever package a caller imports it from."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni.edge import errors, runtime, stream
from vllm_omni.edge.stream import CodecStreamEncoder, StreamStart


def test_frames_that_fit_no_contract_are_one_class_for_the_decoder_and_the_stream_encoder():
    assert runtime.InvalidFramesError is stream.InvalidFramesError is errors.InvalidFramesError
    with pytest.raises(errors.InvalidFramesError, match=r"shape \[T, 16\]"):
        runtime.check_frames(np.zeros((3, 15), dtype=np.int64), num_quantizers=16, codebook_size=2048)
    encoder = CodecStreamEncoder(StreamStart(num_quantizers=16, codebook_size=2048, frame_rate=12.5, sample_rate=24000))
    with pytest.raises(errors.InvalidFramesError, match=r"\[T, 16\]"):
        encoder.frames(np.zeros((3, 15), dtype=np.int64))
