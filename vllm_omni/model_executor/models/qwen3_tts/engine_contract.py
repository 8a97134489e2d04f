"""The contract between the API server and the talker inside vLLM's engine, stated once.

vLLM moves token ids in and out of its engine; the talker needs more than one id per position, a
per-request spec, and 16 codes per frame out. Everything that crosses is here: the ids in, the spec
in ``SamplingParams.extra_args``, the residual channel out (the widening of the logits on the engine
side, :class:`FrameAssembler` on the server side), and the engine settings the channel needs
(:data:`LOGPROBS_MODE`, :data:`MAX_LOGPROBS`, :data:`LOGITS_PROCESSOR`). ``engine_settings`` applies
them to an engine's arguments and ``check_engine`` (in the model) refuses an engine without them.

**Prompt positions in.** A prompt position of the official model is either a projected text token
(``E_t(t)``) or the sum of a projected text token and a codec embedding (``E_t(t) + E_c(c)``).
Both are encoded as one prompt id, so a prompt describes itself and needs no side channel::

    t                               text only, 0 <= t < text_vocab
    text_vocab + t * codec_vocab + c    text t plus codec c

(at the released sizes the largest id is about 4.7e8, inside vLLM's int32 token ids). Generated
positions carry the frame's codebook-0 id, as any LM's sampled token.

**Voice positions in** (Base checkpoints, voice cloning). A cloned voice adds positions whose codec
part is not one codec id but a vector of the request: the speaker embedding (slot 0) or the summed
16 codebook embeddings of reference frame ``j`` (slot ``j + 1``). They are encoded after the pairs,
with the text id they carry::

    voice_base + t * VOICE_SLOTS + slot      text t plus the request's voice vector ``slot``

(``voice_base = text_vocab * (codec_vocab + 1)``; at the released sizes the largest is about 1.1e9)
and the vectors travel with the request (``TalkerRequestSpec.speaker_embedding`` / ``reference_codes``).

**The request spec in.** Each request carries a :class:`TalkerRequestSpec` (JSON-safe) in
``SamplingParams.extra_args[EXTRA_ARGS_KEY]``: its key, the streamed text ids, the talker's sampling
settings and its voice vectors. The engine's logits processor validates it when the request arrives.

**Residual codes out.** Codebooks 1..15 of a frame come from the code predictor inside the model.
They leave the engine through the logprobs output: the model's logits are widened by
``(groups - 1) * codebook_size`` columns, one per (codebook, code) (:func:`widen_logits`); the step
that completes a frame raises the 15 columns of its codes to :data:`RESIDUAL_MARK`, far above every
codec logit, so they are the top entries of vLLM's raw logprobs (a request asks for
:func:`residual_logprobs` of them), and the talker's logits processor masks the whole range before
sampling. Frame ``j`` leaves in the step that makes it: the model samples its codebook 0 and runs the code
predictor in that step's ``compute_logits``, so output token ``j`` is its codebook 0 and that token's top
logprobs carry its residuals (:class:`FrameAssembler` puts them together).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

# The logits processor every talker engine loads (``logits_processors=[LOGITS_PROCESSOR]``): vLLM imports it by
# this name, in the worker.
LOGITS_PROCESSOR = "vllm_omni.model_executor.models.qwen3_tts.logits_processor:Qwen3TTSLogitsProcessor"
EXTRA_ARGS_KEY = "qwen3_tts"
# The residual codes of a frame ride in the top logprobs of the token that starts it: one entry per residual
# codebook (15 for the released 16-codebook checkpoints). vLLM's own default, 20, leaves room.
MAX_LOGPROBS = 20
LOGPROBS_MODE = "raw_logprobs"  # the logits as the model made them: the raised columns stay on top

# Raised residual columns sit this far above the codec logits (which are O(10)).
RESIDUAL_MARK = 1.0e4


def engine_vocab_size(codec_vocab: int, num_code_groups: int, codebook_size: int) -> int:
    """Width of the logits the talker hands vLLM: the codec vocabulary plus the residual channel."""
    return codec_vocab + (num_code_groups - 1) * codebook_size


def encode_prompt_id(text_id: int, codec_id: int | None, text_vocab: int, codec_vocab: int) -> int:
    """One prompt id for ``E_t(text_id)`` (``codec_id`` None) or ``E_t(text_id) + E_c(codec_id)``."""
    if not 0 <= text_id < text_vocab:
        raise ValueError(f"text id {text_id} outside the text vocabulary [0, {text_vocab})")
    if codec_id is None:
        return text_id
    if not 0 <= codec_id < codec_vocab:
        raise ValueError(f"codec id {codec_id} outside the codec vocabulary [0, {codec_vocab})")
    return text_vocab + text_id * codec_vocab + codec_id


# Voice vectors one request may address: the speaker embedding and up to 4095 reference frames (327 s).
VOICE_SLOTS = 4096
SPEAKER_SLOT = 0


def voice_base(text_vocab: int, codec_vocab: int) -> int:
    """The first voice-position id (every text and pair id is below it)."""
    return text_vocab * (codec_vocab + 1)


def encode_voice_id(text_id: int, slot: int, text_vocab: int, codec_vocab: int) -> int:
    """One prompt id for ``E_t(text_id)`` plus the request's voice vector ``slot`` (0: speaker, j + 1: frame j)."""
    if not 0 <= text_id < text_vocab:
        raise ValueError(f"text id {text_id} outside the text vocabulary [0, {text_vocab})")
    if not 0 <= slot < VOICE_SLOTS:
        raise ValueError(f"voice slot {slot} outside [0, {VOICE_SLOTS}): at most {VOICE_SLOTS - 1} reference frames")
    return voice_base(text_vocab, codec_vocab) + text_id * VOICE_SLOTS + slot


def residual_column_offsets(num_code_groups: int, codec_vocab: int, codebook_size: int) -> list[int]:
    """The logit column of code 0 of each residual codebook (1..15, in order); code ``c`` is ``offset + c``."""
    return [codec_vocab + group * codebook_size for group in range(num_code_groups - 1)]


def residual_columns(codes: Iterable[int], codec_vocab: int, codebook_size: int) -> list[int]:
    """Logit columns that carry residual codes (codebooks 1..15, in order) of one frame."""
    codes = [int(code) for code in codes]
    offsets = residual_column_offsets(len(codes) + 1, codec_vocab, codebook_size)
    return [offset + code for offset, code in zip(offsets, codes, strict=True)]


def decode_residuals(token_ids: Iterable[int], codec_vocab: int, codebook_size: int, groups: int) -> list[int] | None:
    """Residual codes from the ids of one position's top logprobs, or None if none are there.

    Raises ``ValueError`` when the channel is partial or inconsistent (a frame must carry exactly
    one code per residual codebook).
    """
    codes: dict[int, int] = {}
    for token_id in token_ids:
        if token_id < codec_vocab:
            continue
        group, code = divmod(token_id - codec_vocab, codebook_size)
        if group >= groups or group in codes:
            raise ValueError(f"residual channel: unexpected id {token_id} (codebook {group + 1}, code {code})")
        codes[group] = code
    if not codes:
        return None
    if len(codes) != groups:
        raise ValueError(f"residual channel: {len(codes)} of {groups} residual codes present")
    return [codes[group] for group in range(groups)]


def residual_logprobs(num_code_groups: int) -> int:
    """The top logprobs a talker request asks for: one per residual codebook (at most :data:`MAX_LOGPROBS`)."""
    return num_code_groups - 1


def widen_logits(
    codec_logits: torch.Tensor,
    width: int,
    rows: torch.Tensor | None,
    residuals: torch.Tensor | None,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """``[n, width]`` logits: the codec head's ``codec_logits [n, codec_vocab]``, the residual channel at
    ``-RESIDUAL_MARK`` but for the frames completed in this step: row ``rows[i]`` raises the 15 columns
    of ``residuals[i]`` (``int64[groups - 1]``) to ``RESIDUAL_MARK``; ``offsets`` (int64[groups - 1]) holds
    :func:`residual_column_offsets`. Device work only."""
    logits = torch.full(
        (codec_logits.shape[0], width), -RESIDUAL_MARK, dtype=codec_logits.dtype, device=codec_logits.device
    )
    logits[:, : codec_logits.shape[1]] = codec_logits
    if rows is not None and residuals is not None:
        logits[rows.unsqueeze(1), residuals + offsets] = RESIDUAL_MARK
    return logits


@dataclass(frozen=True)
class TalkerRequestSpec:
    """What the engine needs per request beyond its prompt ids (JSON-safe, travels in extra_args)."""

    request_key: str
    trailing_text_ids: tuple[int, ...]  # streamed text: one text id per frame, then pad
    # Text still arriving (a streaming-input session, ``speech.stream_text``): the first chunk names the trailing
    # text ids known so far; each later chunk names only the ids added since the chunk before it (and no voice
    # vectors or resume frames: they are the first chunk's). The request pauses between chunks and is never
    # finished by its chunk's max_tokens. ``tokens_before``: the frames the request holds before this chunk (the
    # last of them, whose token vLLM drops when a chunk ends, is this chunk's one prompt position).
    text_open: bool = False
    tokens_before: int = 0
    # A text stream resumed in a new request after its KV cache was released while it waited for text: the frames
    # it made before (16 codes each). The prompt ends with their codebook-0 ids, at the positions they were made
    # at, and the worker recomputes them exactly as it made them.
    resume_frames: tuple[tuple[int, ...], ...] = ()
    repetition_penalty: float = 1.05
    min_new_tokens: int = 2
    # Codebook 0's sampling (the official do_sample / temperature / top_k / top_p; top_k 0: off), done by the model
    # in the step that makes the frame; vLLM's own sampler then only takes the one code the model left.
    greedy: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    subtalker_greedy: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: int | None = None
    # A cloned voice (Base checkpoints): the vectors its voice positions add (see above).
    speaker_embedding: tuple[float, ...] = ()  # slot 0: the x-vector, talker hidden size
    reference_codes: tuple[tuple[int, ...], ...] = ()  # slot j + 1: reference frame j, 16 codes

    def to_extra_args(self) -> dict[str, Any]:
        spec = asdict(self)
        spec["trailing_text_ids"] = list(self.trailing_text_ids)
        spec["speaker_embedding"] = list(self.speaker_embedding)
        spec["reference_codes"] = [list(frame) for frame in self.reference_codes]
        spec["resume_frames"] = [list(frame) for frame in self.resume_frames]
        return {EXTRA_ARGS_KEY: spec}

    def next_chunk(self, added_text_ids: Sequence[int], text_open: bool, tokens_before: int) -> TalkerRequestSpec:
        """The spec of a text stream's next chunk: the text ids added since this one, nothing repeated."""
        return replace(
            self,
            trailing_text_ids=tuple(added_text_ids),
            text_open=text_open,
            tokens_before=tokens_before,
            speaker_embedding=(),
            reference_codes=(),
            resume_frames=(),
        )

    def continued_by(self, chunk: TalkerRequestSpec) -> TalkerRequestSpec | None:
        """This (open) stream's spec with the next ``chunk`` applied (:meth:`next_chunk`), or None if ``chunk``
        changes more than the text (and whether it is open) or does not follow on."""
        if not self.text_open or chunk.next_chunk((), True, 0) != self.next_chunk((), True, 0):
            return None
        return replace(
            self,
            trailing_text_ids=self.trailing_text_ids + chunk.trailing_text_ids,
            text_open=chunk.text_open,
            tokens_before=chunk.tokens_before,
        )

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
                "spec); build requests with vllm_omni.entrypoints.generation.speech (CodecFrameGenerator or "
                "build_engine_request)"
            )
        try:
            spec = cls(
                **{
                    **raw,
                    "trailing_text_ids": tuple(int(t) for t in raw.get("trailing_text_ids", ())),
                    "speaker_embedding": tuple(float(x) for x in raw.get("speaker_embedding", ())),
                    "reference_codes": tuple(tuple(int(c) for c in frame) for frame in raw.get("reference_codes", ())),
                    "resume_frames": tuple(tuple(int(c) for c in frame) for frame in raw.get("resume_frames", ())),
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
        if len({len(frame) for frame in spec.resume_frames}) > 1 or any(c < 0 for f in spec.resume_frames for c in f):
            raise ValueError("talker request spec: resume_frames must be frames of one width, codes >= 0")
        if not (math.isfinite(spec.repetition_penalty) and spec.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {spec.repetition_penalty}")
        for greedy, temperature, top_k, top_p, name in (
            (spec.greedy, spec.temperature, spec.top_k, spec.top_p, "codebook-0"),
            (spec.subtalker_greedy, spec.subtalker_temperature, spec.subtalker_top_k, spec.subtalker_top_p, "residual"),
        ):
            if not isinstance(greedy, bool) or not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
                raise ValueError(f"{name} sampling: greedy must be a bool and top_k an integer >= 0 (0: off)")
            if not greedy and not (math.isfinite(temperature) and temperature > 0 and 0 < top_p <= 1):
                raise ValueError(f"{name} sampling needs temperature > 0 and 0 < top_p <= 1")
        return spec


class FrameAssembler:
    """Turns one request's sampled ids and their top logprobs into complete frames, incrementally.

    Output token ``j`` is codebook 0 of frame ``j`` and its top logprobs carry the frame's residual codes: the
    model makes the whole frame in the step that samples it. EOS ends the stream and is not a frame; the EOS the
    engine forces on a request it failed (``TalkerRequestState.fail``) carries no residual codes, so
    :attr:`failed` tells a failure from the talker's own end.
    """

    def __init__(self, codec_vocab: int, codebook_size: int, groups: int, eos_token_id: int) -> None:
        self.codec_vocab, self.codebook_size, self.groups, self.eos = (
            codec_vocab,
            codebook_size,
            groups - 1,
            eos_token_id,
        )
        self.ended = False
        self.failed = False

    def feed(self, token_ids: Sequence[int], logprobs: Sequence[dict[int, Any]] | None) -> list[list[int]]:
        if logprobs is None or len(logprobs) != len(token_ids):
            raise RuntimeError(
                f"the engine returned no logprobs for the talker's tokens: request logprobs >= {self.groups}"
            )
        frames = []
        for token, top in zip(token_ids, logprobs, strict=True):
            if self.ended:
                break
            residuals = decode_residuals(top.keys(), self.codec_vocab, self.codebook_size, self.groups)
            if token == self.eos:
                self.ended, self.failed = True, residuals is None
                break
            if residuals is None:
                raise RuntimeError("the talker did not send the residual codes of a frame")
            frames.append([token, *residuals])
        return frames
