"""The windowed stream driver with eager windows: exact start, piece-size independence, flush, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.geometry import CodecGeometry
from vllm_omni.edge.graphs.windowed import EagerWindowRunner
from vllm_omni.edge.runtime import InvalidFramesError, WindowedDecoder
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.reference import eager_windowed_decoder

RAMP, CONTEXT = (2, 4, 8), 16  # windows 0+2, 2+4, 6+8, 14+8, then 16+8


def full_decode(decoder, frames: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return decoder(torch.from_numpy(frames.T[None].copy())).numpy().ravel()


def stream(windowed: WindowedDecoder, frames: np.ndarray, pieces: list[int]) -> np.ndarray:
    out, start = [], 0
    for size in pieces:
        out.append(windowed.feed(frames[start : start + size]))
        start += size
    out.append(windowed.feed(frames[start:]))
    out.append(windowed.flush())
    return np.concatenate(out)


@pytest.fixture(scope="module")
def frames(small_decoder) -> np.ndarray:
    config = small_decoder.config
    return random_codes(45, config.num_quantizers, config.codebook_size, seed=3)[0].T.numpy().copy()


def test_windows_holding_the_whole_stream_equal_the_full_decode(small_decoder, frames):
    hop = small_decoder.total_upsample
    audio = stream(eager_windowed_decoder(small_decoder, RAMP, CONTEXT), frames, [1, 3, 5, 7])
    reference = full_decode(small_decoder, frames)
    assert audio.shape == reference.shape
    exact = 2 + 4 + 8 + 8  # frames decoded while the window still held every frame so far
    assert snr_db(reference[: exact * hop], audio[: exact * hop]) > 90
    assert np.abs(reference[: exact * hop] - audio[: exact * hop]).max() < 1e-5
    # Past the context the window is an approximation, but still close at this geometry.
    assert snr_db(reference[exact * hop :], audio[exact * hop :]) > 20


def test_output_does_not_depend_on_how_frames_arrive(small_decoder, frames):
    windowed = eager_windowed_decoder(small_decoder, RAMP, CONTEXT)
    one_piece = stream(windowed, frames, [])
    trickle = stream(windowed, frames, [1] * 44)
    np.testing.assert_array_equal(one_piece, trickle)


def test_flush_decodes_a_short_tail_exactly_and_resets(small_decoder, frames):
    hop = small_decoder.total_upsample
    windowed = eager_windowed_decoder(small_decoder, RAMP, CONTEXT)
    assert len(windowed.feed(frames[:5])) == 2 * hop  # chunk 2 done, 3 frames wait for a chunk of 4
    assert windowed.pending_frames == 3
    audio = np.concatenate([full_decode(small_decoder, frames[:2]), windowed.flush()])
    np.testing.assert_allclose(audio, full_decode(small_decoder, frames[:5]), atol=1e-5)
    assert windowed.position == 0 and windowed.pending_frames == 0
    again = stream(windowed, frames[:5], [])
    np.testing.assert_allclose(again, audio, atol=1e-6)


def test_bad_frames_raise_and_leave_the_stream_as_it_was(small_decoder, frames):
    windowed = eager_windowed_decoder(small_decoder, RAMP, CONTEXT)
    windowed.feed(frames[:3])
    size = small_decoder.config.codebook_size
    with pytest.raises(InvalidFramesError, match=r"\[T, 16\]"):
        windowed.feed(frames[:3].T)
    bad = frames[:2].copy()
    bad[1, 2] = size
    with pytest.raises(InvalidFramesError, match=f"0..{size - 1}.*stream position 4"):
        windowed.feed(bad)
    with pytest.raises(InvalidFramesError, match="integer"):
        windowed.feed(frames[:2].astype(np.float32))
    assert (windowed.position, windowed.pending_frames) == (2, 1)


def test_a_missing_program_is_named(small_decoder):
    from vllm_omni.edge.graphs.window_contract import Window

    runners = {Window(0, 2): EagerWindowRunner(small_decoder, Window(0, 2))}
    with pytest.raises(EdgeError, match="window_c2_n4"):
        WindowedDecoder(runners, RAMP, CONTEXT, CodecGeometry(24000, 48, 16, small_decoder.config.codebook_size))
