"""How the Qwen3-TTS talker's inputs and outputs are laid out as vLLM token ids.

vLLM moves token ids in and out of its engine; the talker needs more than one id per position.

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

**Residual codes out.** Codebooks 1..15 of a frame come from the code predictor inside the model.
They leave the engine through the logprobs output: the model's logits are widened by
``(groups - 1) * codebook_size`` columns, one per (codebook, code); the step that completes a
frame raises the 15 columns of its codes far above every codec logit, so they are the top
entries of vLLM's raw logprobs, and the talker's logits processor masks the whole range before
sampling. Frame ``j`` is complete when token ``j + 1`` is sampled: its codebook 0 is output token
``j``, its residuals ride with output token ``j + 1``.
"""

from __future__ import annotations

from collections.abc import Iterable

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
