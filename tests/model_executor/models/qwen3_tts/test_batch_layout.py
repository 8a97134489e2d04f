"""Splitting an engine step's flat tokens into batch rows from positions and KV slots (``batch_layout``).

Plain Python: runs in the main venv. The random steps are laid out as vLLM's model runner lays them
out (rows after one another, each request's tokens at consecutive positions, slots from its own
blocks, padding with slot -1), with chunked prefills, decodes, resumed requests and block crossings.
"""

from __future__ import annotations

import random

import pytest

from vllm_omni.model_executor.models.qwen3_tts.batch_layout import real_tokens, row_starts


def runner_step(rng: random.Random, rows: int, block_size: int, padding: int = 0):
    """``(positions, slots, true starts)`` of a step of ``rows`` requests, each with blocks of its own."""
    free = list(range(4096))
    rng.shuffle(free)
    positions: list[int] = []
    slots: list[int] = []
    starts = []
    for _ in range(rows):
        starts.append(len(positions))
        kind = rng.random()
        if kind < 0.5:  # a decode: one token after what the request has computed
            computed, count = rng.randrange(0, 300), 1
        elif kind < 0.75:  # a prefill from the start, maybe chunked
            computed, count = 0, rng.randrange(1, 200)
        else:  # a later chunk of a prefill (or a resumed request), often starting on a block boundary
            computed = rng.choice((rng.randrange(1, 300), block_size * rng.randrange(1, 8)))
            count = rng.randrange(1, 100)
        blocks = [free.pop() for _ in range((computed + count) // block_size + 1)]
        for position in range(computed, computed + count):
            positions.append(position)
            slots.append(blocks[position // block_size] * block_size + position % block_size)
    starts.append(len(positions))
    positions += [0] * padding
    slots += [-1] * padding
    return positions, slots, starts


def ambiguous(positions: list[int], slots: list[int], starts: list[int], block_size: int) -> bool:
    """Whether another layout fits the same positions and slots: a row start and a block crossing inside a row
    that both fall on a block's first position right after the token before."""
    tokens = range(1, real_tokens(slots))
    at_block = [i for i in tokens if positions[i] == positions[i - 1] + 1 and positions[i] % block_size == 0]
    return any(i in starts for i in at_block) and any(i not in starts for i in at_block)


@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_random_steps_split_exactly_or_say_they_cannot(block_size: int):
    rng = random.Random(block_size)
    undecided = 0
    for trial in range(1500):
        rows = rng.randrange(1, 12)
        positions, slots, starts = runner_step(rng, rows, block_size, padding=rng.choice((0, 0, 5)))
        got = row_starts(positions, slots, rows, block_size)
        if got is None:
            undecided += 1
            assert ambiguous(positions, slots, starts, block_size), (trial, positions, slots, starts)
        else:
            assert got == starts, (trial, positions, slots)
    assert undecided < 25, f"{undecided} of 1500 steps undecided"


def test_adjacent_requests_at_consecutive_positions():
    # Row 0 decodes at position 40, row 1 at 41, row 2 at 42: consecutive, told apart by their slots.
    positions, slots = [40, 41, 42], [3 * 32 + 8, 7 * 32 + 9, 1 * 32 + 10]
    assert row_starts(positions, slots, 3, 32) == [0, 1, 2, 3]
    # One request prefilling 40..42 has contiguous slots: one row.
    assert row_starts(positions, [104, 105, 106], 1, 32) == [0, 3]


def test_a_block_start_is_settled_by_the_row_count():
    # Row 0 holds 30..31 (its chunk ends with its block), row 1 starts at 32 in a block of its own.
    positions, slots = [30, 31, 32, 33], [62, 63, 320, 321]
    assert row_starts(positions, slots, 2, 32) == [0, 2, 4]
    assert row_starts(positions, slots, 1, 32) == [0, 4]  # the same tokens as one request crossing into block 10


def test_impossible_steps_are_refused():
    assert row_starts([5, 6], [10, 11], 3, 16) is None  # three rows need three tokens
    assert row_starts([5, 9], [10, 40], 1, 16) is None  # one row cannot jump positions
    assert row_starts([0, 0], [-1, -1], 0, 16) == [0]  # padding only
    with pytest.raises(ValueError, match="same tokens"):
        row_starts([1, 2], [1], 1, 16)
