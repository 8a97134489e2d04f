"""The talker's vLLM logits processor: keeps the engine's :class:`~.talker_batch.TalkerBatch` in step with vLLM's
persistent batch, and hides the residual channel from sampling. The official codebook-0 rules
(:func:`codebook0_scores`) are applied by the model, which samples codebook 0 in the step that makes the frame.

Loaded by vLLM by name (``engine_contract.LOGITS_PROCESSOR``); it validates each request's spec when
the request arrives (``validate_params``), so a request without one is refused before it runs.
"""

from __future__ import annotations

from typing import Any

import torch

from .engine_contract import TalkerRequestSpec
from .talker_batch import RowTables, talker_batch


def _logits_processor_base() -> type:
    from vllm.v1.sample.logits_processor import LogitsProcessor

    return LogitsProcessor


class Qwen3TTSLogitsProcessor(_logits_processor_base()):
    """Keeps its engine's :class:`~.talker_batch.TalkerBatch` in step with vLLM's batch and hides the residual
    channel from vLLM's sampler."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        talker = vllm_config.model_config.hf_config.talker_config
        self.codec_vocab = talker.vocab_size
        self.eos = talker.codec_eos_token_id
        self.batch = talker_batch(vllm_config)
        self.batch.configure(
            vllm_config.scheduler_config.max_num_seqs,
            self.codec_vocab,
            self.eos,
            device,
            talker.num_code_groups,
            talker.codebook_size,
        )

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        TalkerRequestSpec.from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        batch = self.batch
        batch.sweep()
        if batch_update is None:
            return
        for index in batch_update.removed:
            batch.remove(index)
        for index, params, prompt_ids, output_ids in batch_update.added:
            batch.add(index, params, prompt_ids, output_ids)
        from vllm.v1.sample.logits_processor import MoveDirectionality

        for a, b, direction in batch_update.moved:
            batch.move(a, b, direction == MoveDirectionality.SWAP)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The model already made each row's frame (``compute_logits``): hide the residual channel from sampling,
        and end a request that failed with EOS (the others go on)."""
        logits[:, self.codec_vocab :] = float("-inf")
        for row, state in self.batch.rows.items():
            if state.failure is not None and row < logits.shape[0]:
                logits[row] = float("-inf")
                logits[row, self.eos] = 0.0
        return logits


def codebook0_scores(
    codec_logits: torch.Tensor, tables: RowTables, rows: torch.Tensor, codec_vocab: int, eos: int
) -> torch.Tensor:
    """The official codebook-0 processing of ``codec_logits [n, codec_vocab]`` (float32) of batch ``rows``
    (int64[n]), in place: the codec control range ``[codec_vocab - 1024, codec_vocab)`` but EOS suppressed, the
    repetition penalty over each row's codebook-0 history, EOS barred before ``min_new_tokens`` frames."""
    logits = codec_logits
    eos_logits = logits[:, eos].clone()
    logits[:, max(codec_vocab - 1024, 0) : codec_vocab] = float("-inf")
    logits[:, eos] = eos_logits
    penalty = tables.penalty[rows].unsqueeze(1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    logits.copy_(torch.where(tables.history[rows], penalized, logits))
    logits[:, eos].masked_fill_(tables.frames[rows] < tables.min_frames[rows], float("-inf"))
    return logits
