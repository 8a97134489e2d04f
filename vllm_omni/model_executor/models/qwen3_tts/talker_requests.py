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
  barred before ``min_new_tokens``) and masks the residual-code columns;
* the model reads the same :data:`TALKER_BATCH` in ``forward`` / ``compute_logits`` (same worker
  process), with the forward context's ``query_start_loc`` splitting the flat tokens by row.

State is keyed by the request's own key, not its row, so a preempted request resumes with its
frames, hidden state and sampling generator; state is dropped when its request finishes (EOS or
``max_tokens``), and at most :data:`MAX_PARKED` states of requests out of the batch are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

EXTRA_ARGS_KEY = "qwen3_tts"
LOGITS_PROCESSOR = "vllm_omni.model_executor.models.qwen3_tts.talker_requests:Qwen3TTSLogitsProcessor"
MAX_PARKED = 4096


@dataclass(frozen=True)
class TalkerRequestSpec:
    """What the engine needs per request beyond its prompt ids (JSON-safe, travels in extra_args)."""

    request_key: str
    trailing_text_ids: tuple[int, ...]  # streamed text: one text id per frame, then pad
    repetition_penalty: float = 1.05
    min_new_tokens: int = 2
    subtalker_greedy: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: int | None = None

    def to_extra_args(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["trailing_text_ids"] = list(self.trailing_text_ids)
        return {EXTRA_ARGS_KEY: spec}

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> TalkerRequestSpec:
        raw = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if not isinstance(raw, dict):
            raise ValueError(
                f"a Qwen3-TTS talker request needs SamplingParams.extra_args[{EXTRA_ARGS_KEY!r}] (a talker request "
                "spec); build requests with vllm_omni.entrypoints.speech (CodecFrameGenerator or build_engine_request)"
            )
        try:
            spec = cls(**{**raw, "trailing_text_ids": tuple(int(t) for t in raw.get("trailing_text_ids", ()))})
        except TypeError as error:
            raise ValueError(f"malformed talker request spec in extra_args[{EXTRA_ARGS_KEY!r}]: {error}") from None
        if not spec.request_key:
            raise ValueError("talker request spec: request_key must be a non-empty string")
        if spec.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {spec.repetition_penalty}")
        if not spec.subtalker_greedy and not (spec.subtalker_temperature > 0 and 0 < spec.subtalker_top_p <= 1):
            raise ValueError("subtalker sampling needs temperature > 0 and 0 < top_p <= 1")
        return spec


@dataclass(eq=False)  # identity: states hold tensors and are looked up by object
class TalkerRequestState:
    """One request's talker state; ``frames[j]`` is frame j (16 codes) once its residuals exist."""

    spec: TalkerRequestSpec
    prompt_len: int
    max_tokens: int | None
    output_token_ids: list[int]  # vLLM's live list of this request's sampled ids
    frames: list[list[int]] = field(default_factory=list)
    last_hidden: torch.Tensor | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not self.spec.subtalker_greedy:
            self.generator = torch.Generator()
            seed = self.spec.seed if self.spec.seed is not None else torch.seed()
            self.generator.manual_seed(seed + 1)  # distinct from the codebook-0 stream vLLM seeds with `seed`


@dataclass
class StepRow:
    """What the last forward did for one batch row, read by ``compute_logits``."""

    state: TalkerRequestState | None
    frontier: bool  # the row's last position is the request's newest: its hidden state picks the next token
    new_frame: list[int] | None  # a frame completed in this step, to send out through the residual channel


class TalkerBatch:
    """Which persistent-batch row holds which request, and every live request's state."""

    def __init__(self) -> None:
        self.rows: dict[int, TalkerRequestState] = {}
        self._states: OrderedDict[str, TalkerRequestState] = OrderedDict()
        self.step: list[StepRow] = []
        self.eos_token_id: int | None = None

    def add(self, index: int, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> None:
        spec = TalkerRequestSpec.from_extra_args(params.extra_args)
        state = self._states.get(spec.request_key)
        if state is None:
            state = TalkerRequestState(spec, len(prompt_ids or ()), params.max_tokens, output_ids)
            self._states[spec.request_key] = state
        else:
            state.output_token_ids = output_ids  # resumed after preemption
            self._states.move_to_end(spec.request_key)
        self.rows[index] = state

    def remove(self, index: int) -> None:
        state = self.rows.pop(index, None)
        if state is None:
            return
        outputs = state.output_token_ids
        finished = (outputs and outputs[-1] == self.eos_token_id) or (
            state.max_tokens is not None and len(outputs) >= state.max_tokens
        )
        if finished:
            self._states.pop(state.spec.request_key, None)
        if len(self._states) > MAX_PARKED + len(self.rows):  # requests aborted or long preempted
            live = {id(s) for s in self.rows.values()}
            for key in [k for k, s in self._states.items() if id(s) not in live][: len(self._states) - MAX_PARKED]:
                del self._states[key]

    def move(self, a: int, b: int, swap: bool) -> None:
        first, second = self.rows.pop(a, None), self.rows.pop(b, None)
        if first is not None:
            self.rows[b] = first
        if swap and second is not None:
            self.rows[a] = second


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
        # The official generate suppresses the codec control range [vocab - 1024, vocab) but EOS.
        self.suppressed = [i for i in range(self.codec_vocab - 1024, self.codec_vocab) if i != self.eos]
        TALKER_BATCH.eos_token_id = self.eos

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        TalkerRequestSpec.from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index, params, prompt_ids, output_ids in batch_update.added:
            TALKER_BATCH.add(index, params, prompt_ids, output_ids)
        for index in batch_update.removed:
            TALKER_BATCH.remove(index)
        from vllm.v1.sample.logits_processor import MoveDirectionality

        for a, b, direction in batch_update.moved:
            TALKER_BATCH.move(a, b, direction == MoveDirectionality.SWAP)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits[:, self.codec_vocab :] = float("-inf")  # the residual channel is never sampled
        if self.suppressed:
            logits[:, self.suppressed] = float("-inf")
        for row in range(logits.shape[0]):
            state = TALKER_BATCH.rows.get(row)
            if state is None:
                continue
            history = sorted({frame[0] for frame in state.frames})
            penalty = state.spec.repetition_penalty
            if history and penalty != 1.0:
                index = torch.tensor(history, dtype=torch.long, device=logits.device)
                scores = logits[row, index]
                logits[row, index] = torch.where(scores < 0, scores * penalty, scores / penalty)
            if len(state.frames) < state.spec.min_new_tokens:
                logits[row, self.eos] = float("-inf")
        return logits
