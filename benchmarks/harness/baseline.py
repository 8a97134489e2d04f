"""The baseline most ratios are taken against: the eager full decode (``decode_unchecked``) of the same codes.

:func:`full_decode` runs it in a process of its own (``python -m benchmarks.harness``, :mod:`.__main__`), so its
thread pool and memory are its own; :func:`time_full_decode` is that worker's body. :func:`count_macs` counts a
decode's multiply-accumulates.
"""

from __future__ import annotations

import time
from pathlib import Path

from .processes import peak_rss_mb, run_worker


def full_decode(model: str | Path, codes: str | Path, audio_out: str | Path) -> dict:
    """:func:`time_full_decode` in a fresh process: ``seconds``, ``audio_seconds``, ``rtf``, ``peak_rss_mb``."""
    return run_worker("benchmarks.harness", model=model, codes=codes, audio_out=audio_out)


def time_full_decode(model: str | Path, codes_path: str | Path, audio_out: str | Path) -> dict:
    """Eager full decode of the frame-major ``[frames, quantizers]`` codes in ``codes_path`` (after a warm-up of
    8 frames); saves the audio (float32 ``.npy``) to ``audio_out``.

    Returns ``seconds``, ``audio_seconds``, ``rtf`` (decode seconds / audio seconds) and ``peak_rss_mb``.
    """
    import numpy as np
    import torch

    from vllm_omni.edge.checkpoint import load_code2wav_decoder
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE

    decoder = load_code2wav_decoder(str(model))
    codes = torch.from_numpy(np.load(codes_path)).T[None]
    with torch.inference_mode():
        decoder.decode_unchecked(codes[..., :8])  # warm-up
        start = time.perf_counter()
        audio = decoder.decode_unchecked(codes).numpy().ravel()
        seconds = time.perf_counter() - start
    np.save(audio_out, audio)
    audio_seconds = len(audio) / OUTPUT_SAMPLE_RATE
    return {
        "seconds": seconds,
        "audio_seconds": audio_seconds,
        "rtf": seconds / audio_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }


def count_macs(decoder, codes) -> int:
    """Multiply-accumulates of convolutions, transposed convolutions and linear layers for one decode of ``codes``
    (``[1, quantizers, frames]``), counted from the module shapes."""
    import torch
    from torch import nn

    total = 0

    def hook(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv1d):
            total += output.numel() * module.in_channels // module.groups * module.kernel_size[0]
        elif isinstance(module, nn.ConvTranspose1d):
            total += inputs[0].numel() * module.out_channels * module.kernel_size[0]
        elif isinstance(module, nn.Linear):
            total += output.numel() * module.in_features

    kinds = (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)
    handles = [m.register_forward_hook(hook) for m in decoder.modules() if isinstance(m, kinds)]
    with torch.inference_mode():
        decoder(codes)
    for handle in handles:
        handle.remove()
    return total
