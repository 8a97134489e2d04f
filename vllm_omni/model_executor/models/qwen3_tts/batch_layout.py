"""Which of an engine step's flat tokens belong to which batch row, from what every attention backend is given.

vLLM's model runner lays a step's tokens out row after row (row ``r`` of the persistent batch holds
``starts[r] .. starts[r + 1] - 1``), but says where rows start only inside each attention backend's own
metadata (``query_start_loc`` for FlashAttention and the CPU backend, FlashInfer's prefill/decode
wrappers, ...). The talker reads none of it. It reads the two things the runner itself puts in the
forward context for every backend: each token's **position** and its **KV-cache slot**
(``ForwardContext.slot_mapping``, ``block_id * block_size + position % block_size``; padding tokens
have slot -1), and the number of rows (every row of the batch is scheduled in the step).

Tokens ``i - 1`` and ``i`` are in different rows when

* their positions are not consecutive (a row's positions are), or
* they are consecutive, ``i``'s position is not the first of a block, and its slot does not follow
  ``i - 1``'s: within one request a block's slots are contiguous, and two requests never share a block
  (the talker refuses prefix caching, the only way vLLM shares them).

Where ``i``'s position is the first of a block and follows ``i - 1``'s, either may hold (a request
entering a new block, or another request that starts there): such a point is a row start exactly when
the sure starts alone fall short of the row count. Had both remain possible (a chunked prefill ending
on a block boundary, followed by a row that starts on the next position, in a step where some other
row also crosses a block), the layout is undecidable and :func:`row_starts` says so; the caller fails
those requests rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence


def real_tokens(slots: Sequence[int]) -> int:
    """The number of real tokens: the runner pads a step's end with slot -1."""
    count = len(slots)
    while count and slots[count - 1] < 0:
        count -= 1
    return count


def row_starts(positions: Sequence[int], slots: Sequence[int], rows: int, block_size: int) -> list[int] | None:
    """``[starts of rows 0 .. rows - 1, number of real tokens]``, or None when the tokens cannot be rows.

    ``positions`` and ``slots`` are the step's tokens (padding included); ``rows`` the batch's row count;
    ``block_size`` the KV cache's block size (tokens per block).
    """
    if len(positions) != len(slots) or block_size < 1 or rows < 0:
        raise ValueError(
            f"positions ({len(positions)}) and slots ({len(slots)}) must describe the same tokens, block_size "
            f"({block_size}) >= 1 and rows ({rows}) >= 0"
        )
    count = real_tokens(slots)
    if count < rows or (rows == 0 and count):
        return None  # every row has a token
    if rows == 0:
        return [0]
    sure: list[int] = []
    maybe: list[int] = []
    for index in range(1, count):
        position = positions[index]
        if position != positions[index - 1] + 1:
            sure.append(index)
        elif position % block_size:
            if slots[index] != slots[index - 1] + 1:
                sure.append(index)
        else:
            maybe.append(index)
    missing = rows - 1 - len(sure)
    if missing == 0:
        return [0, *sure, count]
    if missing == len(maybe) and missing > 0:
        return [0, *sorted(sure + maybe), count]
    return None
