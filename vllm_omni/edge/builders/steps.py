"""What every stateful builder shares: the step sizes of a build, and the check of step runners against the
full decode.

The check streams seeded random frames step by step through the runners and compares with the
torch full decode; the step is exact, so a decode under :data:`EXACT_SNR_DB` whose error is not also
that far under full scale (:class:`~vllm_omni.edge.audio.ReferenceMatch`) is a wrong graph.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

from ..audio import ReferenceMatch, match_reference
from ..backends.interface import StepRunner
from ..errors import EdgeExportError
from ..graphs.step_contract import StepContract
from ..hardware.registry import HardwareClass
from ..runtime.stateful_decoder import StatefulDecoder
from .request import BuildRequest, class_default

EXACT_SNR_DB = 90.0
CHECK_SEED = 1234


def seeded_codes(frames: int, num_quantizers: int, codebook_size: int, seed: int) -> torch.Tensor:
    """Uniform codes ``int64[1, num_quantizers, frames]`` from a seeded torch generator (the checks' input)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, codebook_size, (1, num_quantizers, frames), generator=generator)


def check_frames_for(contract: StepContract) -> int:
    """Frames a stepwise check streams: several main steps, and past the sliding window twice over.

    Every conv tail of the released geometry spans fewer input frames than the KV history, so a
    stream twice the window also outgrows the convolutions' receptive field at every stage.
    """
    return max(3 * contract.step_frames, 2 * (contract.kv_slots + 1))


def check_step_runners(
    decoder: Qwen3TTSTokenizerV2Decoder,
    main: StepRunner,
    first: StepRunner | None = None,
    frames: int | None = None,
    label: str = "step",
) -> ReferenceMatch:
    """A stepwise decode through ``main`` (after ``first``) vs the torch full decode.

    The stream is seeded random frames, ends on a padded flush, and is decoded through the
    :class:`StatefulDecoder` a device uses; raises :class:`EdgeExportError` unless the SNR is
    >= :data:`EXACT_SNR_DB` or the peak error is <= -:data:`EXACT_SNR_DB` dBFS (a near-silent
    checkpoint's decode is judged against full scale, :class:`~vllm_omni.edge.audio.ReferenceMatch`).
    """
    contract = main.contract
    frames = frames or check_frames_for(contract) + (first.contract.step_frames if first is not None else 0) + 1
    codes = seeded_codes(frames, contract.num_quantizers, contract.codebook_size, seed=CHECK_SEED)
    with torch.inference_mode():
        reference = decoder(codes)[0, 0].numpy()
    stream = StatefulDecoder(main, first)
    audio = np.concatenate([stream.feed(codes[0].T.numpy()), stream.flush()])
    if audio.shape != reference.shape:
        raise EdgeExportError(f"{label}: stepwise decode gave {audio.size} samples, the full decode {reference.size}")
    match = match_reference(reference, audio, EXACT_SNR_DB)
    if not match.passed:
        raise EdgeExportError(
            f"{label} stepwise decode differs from the full decode over {frames} frames: {match.describe()}; "
            f"expected {match.bar()}. The graph is wrong (its error is not negligible even against full scale); "
            "do not ship it, and report it with this message"
        )
    return match


def step_sizes(hardware_class: HardwareClass, request: BuildRequest) -> dict[str, int]:
    """``{"main": B}`` plus ``{"first": B1}`` when the request (or the class default) has a first step."""
    main = class_default(request.step_frames, hardware_class, "step_frames")
    first = class_default(request.first_step_frames, hardware_class, "first_step_frames") or 0
    if main < 1 or first < 0:
        raise EdgeExportError(
            f"step sizes must be >= 1 frame (first step: 0 for none), found main {main}, first {first}"
        )
    return {"main": main} | ({"first": first} if first else {})
