from __future__ import annotations

import pytest

from vllm_omni.edge.graphs.window_contract import (
    Window,
    WindowConfigError,
    window_at,
    window_schedule,
    windowing_overhead,
)


def test_default_ramp_holds_only_real_frames_until_the_context_is_full():
    schedule = window_schedule([2, 4, 8, 16, 25], 72)
    assert [(w.context_frames, w.chunk_frames) for w in schedule] == [
        (0, 2), (2, 4), (6, 8), (14, 16), (30, 25), (55, 25), (72, 25)
    ]  # fmt: skip
    assert window_at(schedule, 6) == window_at(schedule, 100) == Window(72, 25)


def test_zero_context_needs_one_program_per_ramp_size():
    assert window_schedule([4, 8], 0) == (Window(0, 4), Window(0, 8))


def test_a_ramp_longer_than_the_context_stops_at_the_context():
    assert window_schedule([2, 4, 8], 3) == (Window(0, 2), Window(2, 4), Window(3, 8))


def test_overhead_is_window_over_chunk():
    assert windowing_overhead(Window(72, 2)) == 37
    assert windowing_overhead(Window(72, 25)) == pytest.approx(3.88)


@pytest.mark.parametrize(
    ("ramp", "context", "message"),
    [
        ([], 72, "empty"),
        ([4, 2], 72, "strictly increasing"),
        ([2, 2], 72, "strictly increasing"),
        ([0, 2], 72, ">= 1"),
        ([2, 4], -1, "context must be"),
    ],
)
def test_bad_ramp_or_context_says_what_is_wrong(ramp, context, message):
    with pytest.raises(WindowConfigError, match=message):
        window_schedule(ramp, context)
