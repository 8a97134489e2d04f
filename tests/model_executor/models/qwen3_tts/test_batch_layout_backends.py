"""The talker splits a step's tokens by row the same under every attention backend (serving venv).

The model's own row-splitting code (``Qwen3TTSTalkerForCodecFrames._split_rows``) runs inside a
forward context that holds the attention metadata of vLLM's CPU and FlashAttention backends, built
from vLLM's own classes, and of FlashInfer (its module needs the ``flashinfer`` package, so its
metadata class is made from the field list in vLLM's source file). The metadata is wrapped so that
any read of it fails the test: the rows must come from what the model runner gives every backend.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

LAYER = "model.layers.0.self_attn.attn"
BLOCK_SIZE = 16


class Untouchable:
    """Attention metadata the talker must not read."""

    def __init__(self, metadata) -> None:
        object.__setattr__(self, "_metadata", metadata)

    def __getattr__(self, name: str):
        raise AssertionError(f"the talker read {type(self._metadata).__name__}.{name}: a backend-specific field")


def flashinfer_metadata_fields() -> list[str]:
    import vllm

    source = Path(vllm.__file__).parent / "v1/attention/backends/flashinfer.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "FlashInferMetadata":
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise AssertionError(f"vLLM's {source} no longer defines FlashInferMetadata: update this test")


def metadata_objects(starts: list[int], positions: torch.Tensor, slots: torch.Tensor) -> dict[str, object]:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    seq_lens = torch.tensor([positions[e - 1] + 1 for e in starts[1:]], dtype=torch.int32)
    common = {
        "num_actual_tokens": starts[-1],
        "max_query_len": max(b - a for a, b in itertools.pairwise(starts)),
        "query_start_loc": query_start_loc,
        "max_seq_len": int(seq_lens.max()),
        "seq_lens": seq_lens,
        "block_table": torch.zeros(len(starts) - 1, 64, dtype=torch.int32),
        "slot_mapping": slots,
    }
    fields = flashinfer_metadata_fields()
    assert "query_start_loc" not in fields, "FlashInfer's metadata has query_start_loc now: the reason for this is gone"
    flashinfer = dataclasses.make_dataclass("FlashInferMetadata", fields)
    return {
        "cpu": CPUAttentionMetadata(**common, scheduler_metadata=None),
        "flash_attn": FlashAttentionMetadata(**common),
        "flashinfer": flashinfer(**{name: common.get(name) for name in fields}),
    }


def talker_rows(rows: int):
    """A talker model object with only what ``_split_rows`` uses: its batch (``rows`` requests) and cache config."""
    from torch import nn

    from vllm_omni.model_executor.models.qwen3_tts.modeling_qwen3_tts_talker import Qwen3TTSTalkerForCodecFrames

    model = Qwen3TTSTalkerForCodecFrames.__new__(Qwen3TTSTalkerForCodecFrames)
    nn.Module.__init__(model)
    failures: list[str] = []
    state = SimpleNamespace(spec=SimpleNamespace(request_key="r"), fail=failures.append)
    model.batch = SimpleNamespace(rows=dict.fromkeys(range(rows), state))
    model.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    return model, failures


def step(rng: random.Random, rows: int) -> tuple[list[int], list[int], list[int]]:
    positions, slots, starts, block = [], [], [], rng.randrange(100)
    for _ in range(rows):
        starts.append(len(positions))
        computed, count = (rng.randrange(300), 1) if rng.random() < 0.6 else (0, rng.randrange(2, 40))
        blocks = [block + i for i in range((computed + count) // BLOCK_SIZE + 1)]
        block += len(blocks) + 1
        for position in range(computed, computed + count):
            positions.append(position)
            slots.append(blocks[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE)
    starts.append(len(positions))
    return positions, slots, starts


@pytest.mark.parametrize("backend", ["cpu", "flash_attn", "flashinfer"])
def test_rows_come_from_positions_and_slots_under_every_backend(backend: str):
    from vllm.forward_context import ForwardContext, override_forward_context

    rng = random.Random(backend)
    for _ in range(20):
        rows = rng.randrange(1, 9)
        positions, slots, starts = step(rng, rows)
        padded = torch.tensor(slots + [-1] * 3)  # the GPU runner pads a step to a captured size
        positions_t = torch.tensor(positions + [0] * 3)
        ids = torch.arange(len(positions) + 3)
        metadata = Untouchable(metadata_objects(starts, positions_t, padded)[backend])
        context = ForwardContext(no_compile_layers={}, attn_metadata={LAYER: metadata}, slot_mapping={LAYER: padded})
        model, failures = talker_rows(rows)
        with override_forward_context(context):
            got, host_positions, host_ids = model._split_rows(ids, positions_t)
        assert not failures
        assert got == starts and host_positions[: len(positions)] == positions and host_ids == ids.tolist()


def test_a_step_without_a_slot_mapping_fails_its_requests_and_raises_nothing():
    from vllm.forward_context import ForwardContext, override_forward_context

    model, failures = talker_rows(2)
    context = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
    with override_forward_context(context):
        got, _, _ = model._split_rows(torch.arange(4), torch.arange(4))
    assert got == [] and failures and "no KV slot mapping" in failures[0]
