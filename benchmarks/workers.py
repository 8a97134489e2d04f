"""What the benchmarks share: one process per runtime, its peak RSS, and the eager full-decode baseline."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def count_macs(decoder, codes) -> int:
    """Multiply-accumulates of convolutions, transposed convolutions and linear layers for one decode of ``codes``."""
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


def _status_mb(field: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss would carry the parent's over fork+exec)."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident set now (VmRSS)."""
    return _status_mb("VmRSS") or 0.0


def run_worker(script: str, extra: list[str]) -> dict:
    """Run ``script`` with ``extra`` in a fresh Python; its last stdout line is the JSON result."""
    completed = subprocess.run([sys.executable, script, *extra], capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"worker {extra} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def time_full_decode(model: str, codes_path: str, audio_out: str) -> dict:
    """Eager full decode of the frame-major codes in ``codes_path`` (after a warm-up); saves the audio.

    Returns ``seconds``, ``audio_seconds``, ``rtf`` and ``peak_rss_mb``.
    """
    import numpy as np
    import torch

    from vllm_omni.edge.checkpoint import load_code2wav_decoder
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE

    decoder = load_code2wav_decoder(model)
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
