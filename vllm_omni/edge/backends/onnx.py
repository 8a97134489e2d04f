"""Stateful step graphs as ONNX: export (legacy exporter, opset 17), op-set preflight, contract read-back.

    path = export_step_onnx(decoder, step_frames=4, path="step_b4.onnx")   # checks itself
    contract = graph_contract(path)                                         # B, N, head_dim, layout, ...

Module-level imports are torch-free so the RKNN converter venv can read contracts; the export
imports torch and the stateful wrapper inside the function.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..audio import snr_db
from ..errors import EdgeExportError
from ..files import write_atomically
from ..step_contract import INPUT_NAMES, OUTPUT_NAMES, StepContract, StepContractError

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
EXACT_SNR_DB = 90.0
# Ops that rknn-toolkit2 does not support or that broke conversions (DESIGN §4).
RKNN_RISK_OPS = ("IsNaN", "Neg", "Range", "Reciprocal", "Pad", "Exp", "ConstantOfShape", "Shape", "Split")


def _onnx():
    try:
        import onnx
    except ImportError as exc:
        raise EdgeExportError("onnx is not installed: pip install 'vllm-omni-edge[onnx]' (or onnx)") from exc
    return onnx


@dataclass(frozen=True)
class OpReport:
    nodes: int
    op_counts: dict[str, int]
    risky: dict[str, int]

    def summary(self) -> str:
        risky = ", ".join(f"{op} x{n}" for op, n in sorted(self.risky.items())) or "none"
        return f"{self.nodes} nodes, {len(self.op_counts)} op types; on the RKNN risk list: {risky}"


def op_report(path: str | os.PathLike[str]) -> OpReport:
    """Count the graph's nodes and the ops on the RKNN risk list (DESIGN §4)."""
    model = _onnx().load(str(path), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    return OpReport(sum(counts.values()), dict(counts), {op: counts[op] for op in RKNN_RISK_OPS if counts[op]})


def graph_contract(path: str | os.PathLike[str]) -> StepContract:
    """Read the step contract (B, N, head_dim, cache layout, ...) back out of a step graph file."""
    onnx = _onnx()
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends for non-ONNX files
        raise StepContractError(f"{path} is not a readable ONNX file: {exc}") from exc
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    contract = StepContract.from_metadata(metadata, source=str(path))
    inputs = tuple(i.name for i in model.graph.input)
    outputs = tuple(o.name for o in model.graph.output)
    if inputs != INPUT_NAMES or outputs != OUTPUT_NAMES:
        raise StepContractError(
            f"{path}: expected inputs {INPUT_NAMES} and outputs {OUTPUT_NAMES}, found {inputs} and {outputs}"
        )
    return contract


def export_step_onnx(
    decoder: Qwen3TTSTokenizerV2Decoder,
    step_frames: int,
    path: str | os.PathLike[str],
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    check_frames: int | None = None,
) -> Path:
    """Export a self-contained step graph for ``step_frames`` and (by default) verify it.

    The check decodes ``check_frames`` seeded random frames step by step in onnxruntime and
    compares with the torch full decode: SNR >= 90 dB or :class:`EdgeExportError`. The file is
    written under a temporary name and renamed only after the check passes.
    """
    import torch

    from ..stateful import Code2WavStep

    onnx = _onnx()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    step = Code2WavStep(decoder, step_frames).eval()

    def write(temporary: Path) -> None:
        start = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(
                step,
                step.example_inputs(),
                str(temporary),
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES),
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
            )
        model = onnx.load(str(temporary))
        for key, value in step.contract.to_metadata().items():
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value
        prop = model.metadata_props.add()
        prop.key, prop.value = "qwen3_tts.opset", str(opset)
        onnx.save(model, str(temporary))
        report = op_report(temporary)
        logger.info(
            "exported step B=%d (N=%d) in %.1f s: %s",
            step_frames,
            step.contract.cache_numel,
            time.perf_counter() - start,
            report.summary(),
        )
        if report.risky:
            logger.warning(
                "step B=%d has ops on the RKNN risk list (%s); rknn-toolkit2 2.3.x aborted on such graphs, "
                "2.5.0 converted them in a probe",
                step_frames,
                ", ".join(report.risky),
            )
        if check:
            snr = check_step_graph(decoder, temporary, check_frames)
            logger.info("step B=%d onnxruntime stepwise vs full decode: %.1f dB", step_frames, snr)

    return write_atomically(path, write)


def check_step_graph(
    decoder: Qwen3TTSTokenizerV2Decoder, path: str | os.PathLike[str], frames: int | None = None
) -> float:
    """SNR (dB) of onnxruntime stepwise decode vs the torch full decode; raises below 90 dB."""
    import torch

    from ..runtime.onnx_step import OnnxStepRunner
    from ..runtime.stateful_decoder import StatefulDecoder
    from ..testing.codes import random_codes

    runner = OnnxStepRunner(path)
    contract = runner.contract
    frames = frames or max(3 * contract.step_frames, 2 * (contract.kv_slots + 1))
    codes = random_codes(frames, contract.num_quantizers, contract.codebook_size, seed=1234)
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
