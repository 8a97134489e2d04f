"""StatefulDecoder behaviour that does not depend on the backend: validation, reset, flush."""

import subprocess
import sys

import numpy as np
import pytest

from vllm_omni.edge.graphs.stateful import Code2WavStep, TorchStepRunner
from vllm_omni.edge.runtime import InvalidFramesError, StatefulDecoder
from vllm_omni.testing.codes import random_codes


@pytest.fixture
def decoder(small_decoder):
    return StatefulDecoder(TorchStepRunner(Code2WavStep(small_decoder, 4)))


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (np.full((3, 16), 2048), "0..2047, found 2048 at \\[frame, codebook\\] = \\[0, 0\\]"),
        (np.full((3, 16), -1), "found -1"),
        (np.zeros((3, 15), dtype=np.int64), "shape \\[T, 16\\] \\(frame-major\\), found \\[3, 15\\]"),
        (np.zeros((16, 3), dtype=np.int64), "codebook-major codes need .T"),
        (np.zeros((3, 16), dtype=np.float32), "integer codes, found dtype float32"),
        (np.zeros((1, 3, 16), dtype=np.int64), "found \\[1, 3, 16\\]"),
    ],
)
def test_bad_frames_raise_and_leave_the_stream_untouched(decoder, frames, message):
    good = random_codes(6)[0].T.numpy()
    decoder.feed(good)
    position, pending = decoder.position, decoder.pending_frames
    with pytest.raises(InvalidFramesError, match=message):
        decoder.feed(frames)
    assert (decoder.position, decoder.pending_frames) == (position, pending) == (4, 2)


def test_reset_forgets_the_stream(decoder):
    frames = random_codes(12, seed=3)[0].T.numpy()
    first = decoder.feed(frames)
    decoder.feed(random_codes(9, seed=4)[0].T.numpy())
    decoder.reset()
    assert decoder.position == 0 and decoder.pending_frames == 0
    assert np.array_equal(decoder.feed(frames), first)


def test_flush_decodes_the_tail_and_starts_a_new_stream(decoder):
    frames = random_codes(7, seed=5)[0].T.numpy()
    audio = np.concatenate([decoder.feed(frames), decoder.flush()])
    assert audio.size == 7 * 48
    assert decoder.position == 0 and decoder.pending_frames == 0
    again = np.concatenate([decoder.feed(frames), decoder.flush()])
    assert np.array_equal(audio, again)
    assert decoder.flush().size == 0


def test_drain_decodes_what_whole_steps_take_and_the_stream_goes_on_exactly(small_decoder):
    """Frames trickling in (a talker waiting for text): drained with the plan's step sizes, largest first, the
    audio equals the full decode's and the stream continues; fewer frames than the smallest step stay pending."""
    import torch

    from vllm_omni.edge.audio import snr_db

    frames = random_codes(23, seed=6)[0].T.numpy()
    decoder = StatefulDecoder(
        TorchStepRunner(Code2WavStep(small_decoder, 8)), TorchStepRunner(Code2WavStep(small_decoder, 2))
    )
    audio = [decoder.feed(frames[:3])]  # the first step (B=2) decodes 2; 1 pending
    for start, end in ((3, 8), (8, 9), (9, 20)):
        audio.append(decoder.feed(frames[start:end]))
        audio.append(decoder.drain())
        assert decoder.pending_frames < 2  # smaller than the smallest step
    assert decoder.position == 20 - decoder.pending_frames
    audio.append(decoder.feed(frames[20:]))
    audio.append(decoder.flush())
    with torch.inference_mode():
        full = small_decoder(torch.from_numpy(frames.T.copy())[None]).numpy().ravel()
    streamed = np.concatenate(audio)
    assert streamed.size == full.size
    assert snr_db(full, streamed) > 100


def test_runtime_does_not_import_torch(repo_root):
    script = (
        "import sys, vllm_omni.edge.runtime, vllm_omni.edge.backends.onnx.run, vllm_omni.edge.graphs.step_contract\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
