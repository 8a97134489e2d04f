"""One talker request's state inside the engine's worker: its frames, its seed, and why it failed if it did.

State is keyed by the request's own key (``TalkerRequestSpec.request_key``), not its batch row, so a
preempted request resumes with its frames, and the next chunk of a text stream
(``TalkerRequestSpec.text_open``) continues the state its first chunk made.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field

import torch

from .engine_contract import TalkerRequestSpec

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # identity: states hold tensors and are looked up by object
class TalkerRequestState:
    """One request's talker state; ``frames[j]`` is frame j (``int64[16]`` on the device), made whole in the step
    that samples it.

    ``seed`` drives the sampling of its codes (:mod:`.residual_sampler`): the request's own seed, or one drawn
    from the OS for an unseeded request (never from torch's global RNG).
    """

    spec: TalkerRequestSpec  # the stream's whole spec (every chunk's text applied)
    prompt_len: int  # the prompt's positions before the first frame
    max_tokens: int | None
    output_token_ids: list[int]  # vLLM's live list of this request's sampled ids
    frames: list[torch.Tensor] = field(default_factory=list)
    seed: int = 0
    history: torch.Tensor | None = None  # its row of RowTables.history while parked
    parked_at: float | None = None
    voice_table: torch.Tensor | None = None  # [1 + reference frames, hidden]: its voice vectors, made once
    failure: str | None = None  # why this request cannot go on: it is ended with EOS at its next sampling
    chunk: TalkerRequestSpec | None = None  # the spec vLLM's params carry now (a text stream's latest chunk)

    def __post_init__(self) -> None:
        # 62 bits keep the int64 hash positive.
        self.chunk = self.spec
        self.seed = ((self.spec.seed + 1) if self.spec.seed is not None else secrets.randbits(62)) & ((1 << 62) - 1)

    def fail(self, message: str) -> None:
        """This request cannot go on: logged once, and ended with EOS at its next sampling (the others go on)."""
        if self.failure is None:
            logger.error("%s", message)
            self.failure = message

    def continue_with(self, chunk: TalkerRequestSpec, max_tokens: int | None) -> None:
        """The next chunk of a text stream (``TalkerRequestSpec.next_chunk``): it may only add text (and close it),
        at the frame where the last chunk stopped."""
        spec = self.spec.continued_by(chunk)
        if spec is None or chunk.tokens_before != len(self.frames):
            self.fail(
                f"talker request {chunk.request_key}: a chunk of its text stream does not continue it (only more "
                "text may follow, at the frame where the last chunk stopped); the request ends here"
            )
            return
        self.spec, self.chunk, self.max_tokens = spec, chunk, max_tokens

    def park(self) -> None:
        """Out of the batch, maybe for long: own copies of what were rows of shared step tensors (so a parked
        state holds, and :meth:`nbytes` counts, only its own), and the time it left."""
        if self.frames:
            self.frames = list(torch.stack(self.frames))
        self.parked_at = time.monotonic()

    def nbytes(self) -> int:
        held = [*self.frames, self.history, self.voice_table]
        return sum(t.element_size() * t.nelement() for t in held if t is not None)
