"""Which persistent-batch row holds which talker request, every live request's state, and the per-row tables.

vLLM's model forward sees tokens and positions, not requests. The talker's logits processor learns
from ``update_state`` which persistent-batch row holds which request (:meth:`TalkerBatch.add`,
``remove``, ``move``); the model reads the same :class:`TalkerBatch` in ``forward`` and
``compute_logits``, with :mod:`.batch_layout` splitting the step's flat tokens by row. Both find it
with :func:`talker_batch` by the engine's config (same worker process).

Per-row tables live on the logits' device, indexed by persistent-batch row (:class:`RowTables`): the
codebook-0 ids each request has made (its repetition-penalty history), its penalty, its frame count,
its ``min_new_tokens`` and its residual sampling. They change only when rows join, leave or move.

A request's state is freed when it finishes (EOS or ``max_tokens``) and, when it leaves the batch
otherwise, as soon as the engine has dropped the request (an abort, a client that went away: see
:meth:`TalkerBatch.sweep`); a preempted request's state is parked until it resumes, within
:data:`MAX_PARKED_BYTES` and :data:`MAX_PARKED_SECONDS` (oldest dropped first); a text stream waiting
for its text is parked too, but not evicted by those bounds (its session's own limits bound it).
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from .engine_contract import TalkerRequestSpec
from .request_state import TalkerRequestState
from .residual_sampler import ResidualSampling

# Parked states (requests out of the batch that may resume): bounded in bytes and age.
MAX_PARKED_BYTES = 256 << 20
MAX_PARKED_SECONDS = 900.0


@dataclass
class StepLayout:
    """What the last forward did, read by ``compute_logits``: rows whose last position is their request's
    newest (their hidden state makes the request's next frame)."""

    rows: int = 0
    frontier: list[tuple[int, TalkerRequestState]] = field(default_factory=list)


class RowTables:
    """Per-row tensors on the logits' device, indexed by persistent-batch row.

    ``history`` bool[rows, codec_vocab]: codebook-0 ids made so far (the repetition penalty's set);
    ``penalty`` float32[rows]; ``frames`` int64[rows] (frames made); ``min_frames`` int64[rows]; ``seed``; and
    each row's sampling of codebook 0 (``code0_*``) and of the residual codes (``greedy``, ``temperature``,
    ``top_k``, ``top_p``), so a step gathers the settings of its new frames by row, with no per-request work.
    """

    def __init__(self, rows: int, codec_vocab: int, device: torch.device) -> None:
        self.history = torch.zeros(rows, codec_vocab, dtype=torch.bool, device=device)
        self.penalty = torch.ones(rows, dtype=torch.float32, device=device)
        self.frames = torch.zeros(rows, dtype=torch.int64, device=device)
        self.min_frames = torch.zeros(rows, dtype=torch.int64, device=device)
        self.greedy = torch.ones(rows, dtype=torch.bool, device=device)
        self.temperature = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(rows, dtype=torch.int64, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.code0_greedy = torch.ones(rows, dtype=torch.bool, device=device)
        self.code0_temperature = torch.ones(rows, dtype=torch.float32, device=device)
        self.code0_top_k = torch.zeros(rows, dtype=torch.int64, device=device)
        self.code0_top_p = torch.ones(rows, dtype=torch.float32, device=device)

    def _tables(self) -> tuple[torch.Tensor, ...]:
        return (
            self.history, self.penalty, self.frames, self.min_frames,
            self.greedy, self.temperature, self.top_k, self.top_p, self.seed,
            self.code0_greedy, self.code0_temperature, self.code0_top_k, self.code0_top_p,
        )  # fmt: skip

    def load(self, row: int, state: TalkerRequestState) -> None:
        if state.history is not None:
            self.history[row] = state.history
        else:
            self.history[row].zero_()
        state.history = None
        spec = state.spec
        self.penalty[row] = spec.repetition_penalty
        self.frames[row] = len(state.frames)
        self.min_frames[row] = spec.min_new_tokens
        self.greedy[row] = spec.subtalker_greedy
        self.temperature[row] = spec.subtalker_temperature
        self.top_k[row] = spec.subtalker_top_k
        self.top_p[row] = spec.subtalker_top_p
        self.seed[row] = state.seed
        self.code0_greedy[row] = spec.greedy
        self.code0_temperature[row] = spec.temperature
        self.code0_top_k[row] = spec.top_k
        self.code0_top_p[row] = spec.top_p

    def save(self, row: int, state: TalkerRequestState) -> None:
        state.history = self.history[row].clone()

    def sampling(self, rows: torch.Tensor, all_greedy: bool) -> ResidualSampling:
        """The residual sampling of the frames that ``rows`` (int64[n], batch rows) complete in this step;
        ``all_greedy``: whether every one of them is greedy (known on the host, from the requests' specs)."""
        return self._sampling(rows, all_greedy, self.greedy, self.temperature, self.top_k, self.top_p)

    def code0_sampling(self, rows: torch.Tensor, all_greedy: bool) -> ResidualSampling:
        """Codebook 0's sampling of the frames ``rows`` make in this step (pick with ``CODEBOOK0_GROUP``)."""
        return self._sampling(
            rows, all_greedy, self.code0_greedy, self.code0_temperature, self.code0_top_k, self.code0_top_p
        )

    def _sampling(self, rows: torch.Tensor, all_greedy: bool, *settings: torch.Tensor) -> ResidualSampling:
        greedy, temperature, top_k, top_p = (table[rows] for table in settings)
        return ResidualSampling(all_greedy, greedy, temperature, top_k, top_p, self.seed[rows], self.frames[rows])

    def move(self, a: int, b: int, swap: bool) -> None:
        for table in self._tables():
            if swap:
                table[[a, b]] = table[[b, a]]
            else:
                table[b] = table[a]


class TalkerBatch:
    """Which persistent-batch row holds which request, every live request's state, and the row tables."""

    def __init__(self) -> None:
        self.rows: dict[int, TalkerRequestState] = {}
        self._states: OrderedDict[str, TalkerRequestState] = OrderedDict()
        self._parked: OrderedDict[str, TalkerRequestState] = OrderedDict()  # out of the batch, oldest first
        self.step = StepLayout()
        self.eos_token_id: int | None = None
        self.tables: RowTables | None = None
        self.codec_vocab, self.groups, self.codebook = 0, 16, 0

    def configure(
        self, rows: int, codec_vocab: int, eos_token_id: int, device: torch.device, groups: int = 16, codebook: int = 0
    ) -> None:
        """Size the row tables (``rows``: the engine's ``max_num_seqs``) on the logits' device; ``groups`` codes per
        frame, residual codes below ``codebook`` (0: unchecked), for the frames a resumed stream brings."""
        self.tables = RowTables(rows, codec_vocab, device)
        self.eos_token_id = eos_token_id
        self.codec_vocab, self.groups, self.codebook = codec_vocab, groups, codebook

    def __len__(self) -> int:
        """Requests whose state is held (in the batch or parked)."""
        return len(self._states)

    def held_keys(self) -> list[str]:
        """The request keys whose state is held (in the batch or parked)."""
        return list(self._states)

    def add(self, index: int, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> None:
        spec = TalkerRequestSpec.from_extra_args(params.extra_args)
        self.remove(index)  # a removed row that vLLM reuses is not reported as removed: the added request says so
        state = self._states.get(spec.request_key)
        if state is None:
            resumed = len(spec.resume_frames)
            state = TalkerRequestState(spec, len(prompt_ids or ()) - resumed, params.max_tokens, output_ids)
            if spec.tokens_before:  # a later chunk of a text stream whose state is gone (dropped while paused)
                state.fail(
                    f"talker request {spec.request_key}: its state was dropped while it waited for text "
                    f"({spec.tokens_before} tokens made); the request ends here"
                )
            elif resumed:
                self._resume(state, (prompt_ids or [])[-resumed:])
            self._states[spec.request_key] = state
        else:
            state.output_token_ids = output_ids  # resumed after preemption, or the next chunk of a text stream
            state.parked_at = None
            self._parked.pop(spec.request_key, None)
            if spec != state.chunk:
                state.continue_with(spec, params.max_tokens)
        self.rows[index] = state
        if self.tables is not None:
            self.tables.load(index, state)

    def _resume(self, state: TalkerRequestState, tail: list[int]) -> None:
        """A text stream resumed in a new request: its frames as they were made, its repetition-penalty history.
        The prompt's ``tail`` (its last ``len(resume_frames)`` ids) must be their codebook-0 ids."""
        frames = state.spec.resume_frames
        if (
            state.prompt_len < 1
            or list(tail) != [frame[0] for frame in frames]
            or any(
                len(frame) != self.groups
                or not 0 <= frame[0] < self.codec_vocab
                or (self.codebook and max(frame[1:], default=0) >= self.codebook)
                for frame in frames
            )
        ):
            state.fail(
                f"talker request {state.spec.request_key}: its resume_frames do not fit this model or its prompt "
                f"(frames of {self.groups} codes whose codebook-0 ids end the prompt); the request ends here"
            )
            return
        device = self.tables.history.device if self.tables is not None else torch.device("cpu")
        codes = torch.tensor(frames, dtype=torch.int64, device=device)
        state.frames = list(codes)
        history = torch.zeros(self.codec_vocab, dtype=torch.bool, device=device)
        history[codes[:, 0]] = True
        state.history = history

    def remove(self, index: int) -> None:
        state = self.rows.pop(index, None)
        if state is None:
            return
        outputs = state.output_token_ids
        finished = (outputs and outputs[-1] == self.eos_token_id) or (
            not state.spec.text_open and state.max_tokens is not None and len(outputs) >= state.max_tokens
        )
        key = state.spec.request_key
        if finished:
            self._states.pop(key, None)
            return
        if self.tables is not None:
            self.tables.save(index, state)
        state.park()
        self._parked[key] = state
        self._parked.move_to_end(key)

    def move(self, a: int, b: int, swap: bool) -> None:
        if not swap:
            self.remove(b)  # condensing fills removed rows without reporting them as removed
        first, second = self.rows.pop(a, None), self.rows.pop(b, None)
        if first is not None:
            self.rows[b] = first
        if swap and second is not None:
            self.rows[a] = second
        if self.tables is not None:
            self.tables.move(a, b, swap)

    def sweep(self) -> None:
        """Free parked states the engine no longer holds, then keep the rest within the bounds.

        vLLM's model runner keeps the per-request state of a preempted request (and with it the
        request's output-token list, which this state shares) until it resumes; a finished or
        aborted request's is dropped at once. So a parked state whose output list nobody else
        references belongs to a request that will never come back: an abort, or a client that went
        away. What remains is bounded by :data:`MAX_PARKED_BYTES` and :data:`MAX_PARKED_SECONDS`.
        """
        if not self._parked:
            return
        now, total = time.monotonic(), 0
        for key, state in list(self._parked.items()):
            # 2: this state's attribute and getrefcount's own argument; more: the engine still holds it.
            expired = not state.spec.text_open and now - (state.parked_at or now) > MAX_PARKED_SECONDS
            if sys.getrefcount(state.output_token_ids) <= 2 or expired:
                self._forget(key)
        for key, state in reversed(list(self._parked.items())):  # newest first: the oldest go over the bound
            if state.spec.text_open:  # waiting for text: bounded by its session's limits, not evicted
                continue
            total += state.nbytes()
            if total > MAX_PARKED_BYTES:
                self._forget(key)

    def _forget(self, key: str) -> None:
        self._parked.pop(key, None)
        self._states.pop(key, None)


_BATCHES: dict[str, TalkerBatch] = {}


def talker_batch(vllm_config: Any) -> TalkerBatch:
    """The :class:`TalkerBatch` of the engine whose config is ``vllm_config`` (its logits processor and its model
    share it); one per engine instance in this process."""
    return _BATCHES.setdefault(vllm_config.instance_id, TalkerBatch())
