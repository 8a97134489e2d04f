"""Per-request talker state inside vLLM's engine, and the logits processor that keeps it.

vLLM's model forward sees tokens and positions, not requests. The talker needs, per request, the
frames generated so far (their residual codes feed the next input), the hidden state that chose
the latest codebook-0 token (the code predictor's first input), the streamed text still to add,
and its own sampling settings. So:

* each request carries a :class:`TalkerRequestSpec` in ``SamplingParams.extra_args["qwen3_tts"]``;
* :class:`Qwen3TTSLogitsProcessor` (a vLLM v1 logits processor, loaded with
  ``logits_processors=[LOGITS_PROCESSOR]``) learns from ``update_state`` which persistent-batch
  row holds which request, and before sampling applies the official codebook-0 processing
  (repetition penalty over the frames so far, the codec control range suppressed except EOS, EOS
  barred before ``min_new_tokens``) and masks the residual-code columns, for all rows at once;
* the model reads the same :data:`TALKER_BATCH` in ``forward`` / ``compute_logits`` (same worker
  process), with the forward context's ``query_start_loc`` splitting the flat tokens by row.

Per-row tables live on the logits' device, indexed by persistent-batch row (:class:`RowTables`): the
codebook-0 ids each request has made (its repetition-penalty history), its penalty, its frame count
and its ``min_new_tokens``. They change only when rows join, leave or move.

State is keyed by the request's own key, not its row, so a preempted request resumes with its
frames and hidden state. A request's state is freed when it finishes (EOS or ``max_tokens``) and,
when it leaves the batch otherwise, as soon as the engine has dropped the request (an abort, a
client that went away: see :meth:`TalkerBatch.sweep`); a preempted request's state is parked until
it resumes, within :data:`MAX_PARKED_BYTES` and :data:`MAX_PARKED_SECONDS` (oldest dropped first); a text stream
waiting for its text is parked too, but not evicted by those bounds (its session's own limits bound it).
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from .engine_ids import VOICE_SLOTS
from .residual_sampler import ResidualSampling

logger = logging.getLogger(__name__)

EXTRA_ARGS_KEY = "qwen3_tts"
LOGITS_PROCESSOR = "vllm_omni.model_executor.models.qwen3_tts.talker_requests:Qwen3TTSLogitsProcessor"
# Parked states (requests out of the batch that may resume): bounded in bytes and age.
MAX_PARKED_BYTES = 256 << 20
MAX_PARKED_SECONDS = 900.0


@dataclass(frozen=True)
class TalkerRequestSpec:
    """What the engine needs per request beyond its prompt ids (JSON-safe, travels in extra_args)."""

    request_key: str
    trailing_text_ids: tuple[int, ...]  # streamed text: one text id per frame, then pad
    # Text still arriving (a streaming-input session, ``speech.stream_text``): trailing_text_ids are the ids known
    # so far, each chunk of the session names more; the request pauses between chunks and is never finished by
    # its chunk's max_tokens. ``tokens_before``: the codebook-0 tokens the session sampled before this chunk (the
    # last of them, which vLLM drops when a chunk ends, is this chunk's one prompt token).
    text_open: bool = False
    tokens_before: int = 0
    repetition_penalty: float = 1.05
    min_new_tokens: int = 2
    subtalker_greedy: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: int | None = None
    # A cloned voice (Base checkpoints): the vectors its voice positions add (``engine_ids``).
    speaker_embedding: tuple[float, ...] = ()  # slot 0: the x-vector, talker hidden size
    reference_codes: tuple[tuple[int, ...], ...] = ()  # slot j + 1: reference frame j, 16 codes

    def to_extra_args(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["trailing_text_ids"] = list(self.trailing_text_ids)
        spec["speaker_embedding"] = list(self.speaker_embedding)
        spec["reference_codes"] = [list(frame) for frame in self.reference_codes]
        return {EXTRA_ARGS_KEY: spec}

    def check_voice_values(self) -> None:
        """Raise ``ValueError`` unless the voice vectors are well formed whatever the model: finite numbers,
        frames of one width with codes >= 0, fewer than ``VOICE_SLOTS`` (the engine checks this per request)."""
        if not all(math.isfinite(x) for x in self.speaker_embedding):
            raise ValueError("speaker_embedding holds a non-finite number")
        if len(self.reference_codes) >= VOICE_SLOTS:
            raise ValueError(f"at most {VOICE_SLOTS - 1} reference frames, got {len(self.reference_codes)}")
        if len({len(frame) for frame in self.reference_codes}) > 1 or any(
            c < 0 for f in self.reference_codes for c in f
        ):
            raise ValueError("reference_codes must be frames of one width, codes >= 0")

    def check_voice(self, hidden_size: int, groups: int, codebook_size: int) -> None:
        """Raise ``ValueError`` unless the voice vectors are well formed (:meth:`check_voice_values`) and fit the
        model: an embedding of its hidden size, frames of ``groups`` codes in ``[0, codebook_size)``."""
        self.check_voice_values()
        if self.speaker_embedding and len(self.speaker_embedding) != hidden_size:
            raise ValueError(
                f"speaker_embedding must be {hidden_size} finite numbers (the talker's hidden size), "
                f"got {len(self.speaker_embedding)}"
            )
        for index, frame in enumerate(self.reference_codes):
            if len(frame) != groups or not all(0 <= code < codebook_size for code in frame):
                raise ValueError(
                    f"reference frame {index} must be {groups} codes in [0, {codebook_size}), got {list(frame)[:20]}"
                )

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> TalkerRequestSpec:
        raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if not isinstance(raw, dict):
            raise ValueError(
                f"a Qwen3-TTS talker request needs SamplingParams.extra_args[{EXTRA_ARGS_KEY!r}] (a talker request "
                "spec); build requests with vllm_omni.entrypoints.speech (CodecFrameGenerator or build_engine_request)"
            )
        try:
            spec = cls(
                **{
                    **raw,
                    "trailing_text_ids": tuple(int(t) for t in raw.get("trailing_text_ids", ())),
                    "speaker_embedding": tuple(float(x) for x in raw.get("speaker_embedding", ())),
                    "reference_codes": tuple(tuple(int(c) for c in frame) for frame in raw.get("reference_codes", ())),
                }
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"malformed talker request spec in extra_args[{EXTRA_ARGS_KEY!r}]: {error}") from None
        if not spec.request_key:
            raise ValueError("talker request spec: request_key must be a non-empty string")
        if not isinstance(spec.text_open, bool) or not (
            isinstance(spec.tokens_before, int) and not isinstance(spec.tokens_before, bool) and spec.tokens_before >= 0
        ):
            raise ValueError("talker request spec: text_open must be a bool and tokens_before an integer >= 0")
        spec.check_voice_values()
        if not (math.isfinite(spec.repetition_penalty) and spec.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {spec.repetition_penalty}")
        if not spec.subtalker_greedy and not (
            math.isfinite(spec.subtalker_temperature)
            and spec.subtalker_temperature > 0
            and 0 < spec.subtalker_top_p <= 1
        ):
            raise ValueError("subtalker sampling needs temperature > 0 and 0 < top_p <= 1")
        return spec


@dataclass(eq=False)  # identity: states hold tensors and are looked up by object
class TalkerRequestState:
    """One request's talker state; ``frames[j]`` is frame j (``int64[16]`` on the device) once its residuals exist.

    ``seed`` drives the residual sampling (:mod:`.residual_sampler`): the request's own seed, or one drawn
    from the OS for an unseeded request (never from torch's global RNG).
    """

    spec: TalkerRequestSpec
    prompt_len: int
    max_tokens: int | None
    output_token_ids: list[int]  # vLLM's live list of this request's sampled ids
    frames: list[torch.Tensor] = field(default_factory=list)
    last_hidden: torch.Tensor | None = None
    seed: int = 0
    history: torch.Tensor | None = None  # its row of RowTables.history while parked
    parked_at: float | None = None
    voice_table: torch.Tensor | None = None  # [1 + reference frames, hidden]: its voice vectors, made once
    failure: str | None = None  # why this request cannot go on: it is ended with EOS at its next sampling

    def __post_init__(self) -> None:
        # Distinct from the codebook-0 stream vLLM seeds with `seed`; 62 bits keep the int64 hash positive.
        self.seed = ((self.spec.seed + 1) if self.spec.seed is not None else secrets.randbits(62)) & ((1 << 62) - 1)

    def fail(self, message: str) -> None:
        """This request cannot go on: logged once, and ended with EOS at its next sampling (the others go on)."""
        if self.failure is None:
            logger.error("%s", message)
            self.failure = message

    def continue_with(self, spec: TalkerRequestSpec, max_tokens: int | None) -> None:
        """The next chunk of a text stream: its spec may only add text (and close it) to this one's."""
        old = self.spec
        known = old.trailing_text_ids
        if (
            not old.text_open
            or spec.trailing_text_ids[: len(known)] != known
            or spec.tokens_before != len(self.frames) + 1
            or replace(spec, trailing_text_ids=known, text_open=True, tokens_before=0) != replace(old, tokens_before=0)
        ):
            self.fail(
                f"talker request {spec.request_key}: a chunk of its text stream does not continue it (only more "
                "text may follow, at the frame where the last chunk stopped); the request ends here"
            )
            return
        self.spec, self.max_tokens = spec, max_tokens

    def park(self) -> None:
        """Out of the batch, maybe for long: own copies of what were rows of shared step tensors (so a parked
        state holds, and :meth:`nbytes` counts, only its own), and the time it left."""
        if self.frames:
            self.frames = list(torch.stack(self.frames))
        if self.last_hidden is not None:
            self.last_hidden = self.last_hidden.clone()
        self.parked_at = time.monotonic()

    def nbytes(self) -> int:
        held = [*self.frames, self.last_hidden, self.history, self.voice_table]
        return sum(t.element_size() * t.nelement() for t in held if t is not None)


@dataclass
class StepLayout:
    """What the last forward did, read by ``compute_logits``: rows whose last position is their request's
    newest (their hidden state picks the next token), and the frames the step completed (rows, codes)."""

    rows: int = 0
    frontier: list[tuple[int, TalkerRequestState]] = field(default_factory=list)
    new_rows: torch.Tensor | None = None  # int64[n]: the batch rows that completed a frame
    new_residuals: torch.Tensor | None = None  # int64[n, groups - 1]: their residual codes


class RowTables:
    """Per-row tensors on the logits' device, indexed by persistent-batch row.

    ``history`` bool[rows, codec_vocab]: codebook-0 ids made so far (the repetition penalty's set);
    ``penalty`` float32[rows]; ``frames`` int64[rows] (frames made); ``min_frames`` int64[rows]; and the
    residual sampling of each row (``greedy``, ``temperature``, ``top_k``, ``top_p``, ``seed``), so a step
    gathers the settings of its new frames by row, with no per-request work.
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

    def _tables(self) -> tuple[torch.Tensor, ...]:
        return (
            self.history, self.penalty, self.frames, self.min_frames,
            self.greedy, self.temperature, self.top_k, self.top_p, self.seed,
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

    def save(self, row: int, state: TalkerRequestState) -> None:
        state.history = self.history[row].clone()

    def sampling(self, rows: torch.Tensor) -> ResidualSampling:
        """The residual sampling of the frames that ``rows`` (int64[n], batch rows) complete in this step."""
        return ResidualSampling(
            greedy=self.greedy[rows],
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            seeds=self.seed[rows],
            frames=self.frames[rows],
        )

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

    def configure(self, rows: int, codec_vocab: int, eos_token_id: int, device: torch.device) -> None:
        """Size the row tables (``rows``: the engine's ``max_num_seqs``) on the logits' device."""
        self.tables = RowTables(rows, codec_vocab, device)
        self.eos_token_id = eos_token_id

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
            state = TalkerRequestState(spec, len(prompt_ids or ()), params.max_tokens, output_ids)
            if spec.tokens_before:  # a later chunk of a text stream whose state is gone (dropped while paused)
                state.fail(
                    f"talker request {spec.request_key}: its state was dropped while it waited for text "
                    f"({spec.tokens_before} tokens made); the request ends here"
                )
            self._states[spec.request_key] = state
        else:
            state.output_token_ids = output_ids  # resumed after preemption, or the next chunk of a text stream
            state.parked_at = None
            self._parked.pop(spec.request_key, None)
            if spec != state.spec:
                state.continue_with(spec, params.max_tokens)
        self.rows[index] = state
        if self.tables is not None:
            self.tables.load(index, state)

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


TALKER_BATCH = TalkerBatch()


def _logits_processor_base() -> type:
    from vllm.v1.sample.logits_processor import LogitsProcessor

    return LogitsProcessor


class Qwen3TTSLogitsProcessor(_logits_processor_base()):
    """Keeps :data:`TALKER_BATCH` in step with vLLM's batch and applies the official codebook-0 rules."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        talker = vllm_config.model_config.hf_config.talker_config
        self.codec_vocab = talker.vocab_size
        self.eos = talker.codec_eos_token_id
        TALKER_BATCH.configure(vllm_config.scheduler_config.max_num_seqs, self.codec_vocab, self.eos, device)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        TalkerRequestSpec.from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        TALKER_BATCH.sweep()
        if batch_update is None:
            return
        for index in batch_update.removed:
            TALKER_BATCH.remove(index)
        for index, params, prompt_ids, output_ids in batch_update.added:
            TALKER_BATCH.add(index, params, prompt_ids, output_ids)
        from vllm.v1.sample.logits_processor import MoveDirectionality

        for a, b, direction in batch_update.moved:
            TALKER_BATCH.move(a, b, direction == MoveDirectionality.SWAP)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits = apply_codebook0_rules(logits, TALKER_BATCH.tables, self.codec_vocab, self.eos)
        for row, state in TALKER_BATCH.rows.items():
            if state.failure is not None and row < logits.shape[0]:  # end it: the others go on
                logits[row] = float("-inf")
                logits[row, self.eos] = 0.0
        return logits


def apply_codebook0_rules(logits: torch.Tensor, tables: RowTables | None, codec_vocab: int, eos: int) -> torch.Tensor:
    """The official codebook-0 processing of every row at once, in place: the residual channel masked, the codec
    control range ``[codec_vocab - 1024, codec_vocab)`` but EOS suppressed, the repetition penalty over each
    row's codebook-0 history, EOS barred before ``min_new_tokens`` frames. Row ``i`` is batch row ``i``."""
    rows = logits.shape[0]
    logits[:, codec_vocab:] = float("-inf")  # the residual channel is never sampled
    eos_logits = logits[:, eos].clone()
    logits[:, max(codec_vocab - 1024, 0) : codec_vocab] = float("-inf")
    logits[:, eos] = eos_logits
    if tables is None or rows == 0:
        return logits
    codec = logits[:, :codec_vocab]
    penalty = tables.penalty[:rows].unsqueeze(1)
    penalized = torch.where(codec < 0, codec * penalty, codec / penalty)
    codec.copy_(torch.where(tables.history[:rows], penalized, codec))
    logits[:, eos].masked_fill_(tables.frames[:rows] < tables.min_frames[:rows], float("-inf"))
    return logits
