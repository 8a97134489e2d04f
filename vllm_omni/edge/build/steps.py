"""Stateful step graphs for a build: export to ONNX (or keep), and check each against the full decode.

The check streams seeded random frames step by step through onnxruntime and compares with the
torch full decode; the step is exact, so anything under :data:`EXACT_SNR_DB` is a wrong graph.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

import numpy as np
import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

from ..audio import snr_db
from ..backends.onnx import export_step_onnx, graph_contract
from ..backends.onnxruntime import OnnxStepRunner
from ..checkpoint import checkpoint_sha256, load_code2wav_decoder, resolve_speech_tokenizer
from ..errors import EdgeExportError
from ..files import file_sha256, remove_partial_files
from ..graphs.step_contract import StepContract
from ..hardware.registry import HardwareClass
from ..runtime.stateful_decoder import StatefulDecoder
from .request import BuildRequest, class_default
from .state import BuildState

logger = logging.getLogger(__name__)

EXACT_SNR_DB = 90.0
STATE_NAME = ".build-state.json"
CHECK_SEED = 1234


def seeded_codes(frames: int, num_quantizers: int, codebook_size: int, seed: int) -> torch.Tensor:
    """Uniform codes ``int64[1, num_quantizers, frames]`` from a seeded torch generator (the checks' input)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, codebook_size, (1, num_quantizers, frames), generator=generator)


def check_step_graph(
    decoder: Qwen3TTSTokenizerV2Decoder, path: str | os.PathLike[str], frames: int | None = None
) -> float:
    """SNR (dB) of onnxruntime stepwise decode vs the torch full decode; raises below 90 dB."""
    runner = OnnxStepRunner(path)
    contract = runner.contract
    frames = frames or max(3 * contract.step_frames, 2 * (contract.kv_slots + 1))
    codes = seeded_codes(frames, contract.num_quantizers, contract.codebook_size, seed=CHECK_SEED)
    with torch.inference_mode():
        reference = decoder(codes)[0, 0].numpy()
    stream = StatefulDecoder(runner)
    audio = np.concatenate([stream.feed(codes[0].T.numpy()), stream.flush()])
    if audio.shape != reference.shape:
        raise EdgeExportError(f"{path}: stepwise decode gave {audio.size} samples, the full decode {reference.size}")
    snr = snr_db(reference, audio)
    if snr < EXACT_SNR_DB:
        raise EdgeExportError(
            f"{path}: onnxruntime stepwise decode is {snr:.1f} dB from the full decode over "
            f"{frames} frames; expected >= {EXACT_SNR_DB} dB (max abs "
            f"{np.abs(audio - reference).max():.3g}). The graph is wrong; do not ship it."
        )
    return snr


def export_checked_step(
    decoder: Qwen3TTSTokenizerV2Decoder,
    step_frames: int,
    path: Path,
    opset: int = 17,
    graph_layout: str | None = None,
) -> Path:
    """Export a step graph and check it against the full decode before it is renamed into place."""

    def verify(temporary: Path) -> None:
        snr = check_step_graph(decoder, temporary)
        logger.info("step B=%d onnxruntime stepwise vs full decode: %.1f dB", step_frames, snr)

    return export_step_onnx(decoder, step_frames, path, opset=opset, verify=verify, graph_layout=graph_layout)


def step_sizes(hardware_class: HardwareClass, request: BuildRequest) -> dict[str, int]:
    """``{"main": B}`` plus ``{"first": B1}`` when the request (or the class default) has a first step."""
    main = class_default(request.step_frames, hardware_class, "step_frames")
    first = class_default(request.first_step_frames, hardware_class, "first_step_frames") or 0
    if main < 1 or first < 0:
        raise EdgeExportError(
            f"step sizes must be >= 1 frame (first step: 0 for none), found main {main}, first {first}"
        )
    return {"main": main} | ({"first": first} if first else {})


def export_steps(
    hardware_class: HardwareClass, request: BuildRequest, graph_layout: str | None = None
) -> tuple[dict[str, tuple[Path, StepContract, float | None]], dict[str, str]]:
    """Export (or keep) the ONNX step graphs of ``request``; returns ``{role: (path, contract, snr)}`` and the model.

    ``graph_layout`` picks the formulation (``None``: the CPU one; the Rockchip builder passes
    ``time_on_height``, :mod:`vllm_omni.edge.graphs.npu_layout`); it is part of the kept graphs' fingerprint.

    A kept graph (same checkpoint, same step size, same sha256 as recorded) is checked again in
    onnxruntime against the full decode when ``request.check`` is set.
    """
    sizes = step_sizes(hardware_class, request)
    files = resolve_speech_tokenizer(request.model)
    fingerprint = {"checkpoint_sha256": checkpoint_sha256(files)}
    if graph_layout is not None:  # the CPU builds' fingerprint stays as it was
        fingerprint["graph_layout"] = graph_layout
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_files(out_dir)  # a killed build's half-written graphs
    state = BuildState(out_dir / STATE_NAME, fingerprint, "steps")

    @cache
    def decoder() -> Qwen3TTSTokenizerV2Decoder:
        return load_code2wav_decoder(files.directory)

    graphs: dict[str, tuple[Path, StepContract, float | None]] = {}
    for index, (role, frames) in enumerate(sizes.items(), start=1):
        label = f"[{index}/{len(sizes)}] {role} step B={frames}"
        path = out_dir / f"step_b{frames}.onnx"
        kept = state.intact(path.name, lambda _record, path=path: path) is not None
        if kept:
            request.progress(f"{label}: kept {path.name} ({path.stat().st_size / 1e6:.1f} MB, intact)")
        else:
            request.progress(f"{label}: exporting {path.name}")
            export_step_onnx(decoder(), frames, path, graph_layout=graph_layout)
        snr = None
        if request.check:  # kept graphs too: verification, not hope
            try:
                snr = check_step_graph(decoder(), path)
            except EdgeExportError:
                path.unlink(missing_ok=True)
                raise
        if not kept:
            state.record(path.name, {"sha256": file_sha256(path), "size_bytes": path.stat().st_size})
        contract = graph_contract(path)
        verdict = f"onnxruntime stepwise vs full decode {snr:.1f} dB" if snr is not None else "not checked"
        request.progress(f"{label}: {path.name} N={contract.cache_numel}: {verdict}")
        graphs[role] = (path, contract, snr)
    model = {"id": str(request.model), "checkpoint_sha256": fingerprint["checkpoint_sha256"]}
    return graphs, model
