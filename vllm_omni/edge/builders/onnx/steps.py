"""Stateful step graphs for a build: export to ONNX (or keep), and check each in onnxruntime against the full decode.

The check streams seeded random frames step by step through onnxruntime and compares with the
torch full decode (:func:`~..steps.check_step_runners`).
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

from ...audio import ReferenceMatch
from ...backends.onnx.export import export_step_onnx
from ...backends.onnx.graph import external_data_name, graph_contract
from ...backends.onnx.run import OnnxStepGraph
from ...checkpoint import checkpoint_sha256, load_code2wav_decoder, model_label, resolve_speech_tokenizer
from ...errors import EdgeExportError
from ...files import file_sha256, remove_partial_files
from ...graphs.step_contract import StepContract
from ...hardware.registry import HardwareClass
from ..request import BuildRequest, class_default
from ..state import STATE_NAME, BuildState
from ..steps import check_step_runners, step_sizes

logger = logging.getLogger(__name__)


def check_step_graph(
    decoder: Qwen3TTSTokenizerV2Decoder,
    path: str | os.PathLike[str],
    frames: int | None = None,
    first_step_frames: int | None = None,
) -> ReferenceMatch:
    """onnxruntime stepwise decode vs the torch full decode; raises unless it matches at :data:`~..steps.EXACT_SNR_DB`.

    ``first_step_frames``: also run a first step of that size (a dynamic graph serving both roles),
    so the check covers the mixed schedule a plan runs.
    """
    graph = OnnxStepGraph(path)
    first = graph.runner(first_step_frames) if first_step_frames else None
    return check_step_runners(decoder, graph.runner(), first, frames=frames, label=f"{path}: onnxruntime")


def export_checked_step(
    decoder: Qwen3TTSTokenizerV2Decoder,
    step_frames: int,
    path: Path,
    opset: int = 17,
    graph_layout: str | None = None,
    pass_frames: int | None = None,
    form: str = "npu",
    first_step_frames: int | None = None,
) -> Path:
    """Export a step graph and check it against the full decode before it is renamed into place.

    ``first_step_frames``: a dynamic graph (``form``) is checked on the mixed schedule it will run.
    """

    def verify(temporary: Path) -> None:
        match = check_step_graph(decoder, temporary, first_step_frames=first_step_frames)
        logger.info("step B=%d onnxruntime stepwise vs full decode: %s", step_frames, match.describe())

    return export_step_onnx(
        decoder,
        step_frames,
        path,
        opset=opset,
        verify=verify,
        form=form,
        graph_layout=graph_layout,
        pass_frames=pass_frames,
    )


def step_graph_form(hardware_class: HardwareClass, request: BuildRequest | None = None) -> str:
    """``cpu`` (one dynamic graph for every step size, onnxruntime), ``npu_dynamic`` (one NPU graph that the
    backend compiles for the plan's step sizes, when the class's ``one_step_graph`` is set and the request
    keeps it) or ``npu`` (a static graph per size)."""
    if hardware_class.backend == "onnxruntime":
        return "cpu"
    one_graph = class_default(request.one_step_graph if request else None, hardware_class, "one_step_graph")
    return "npu_dynamic" if one_graph else "npu"


def export_steps(
    hardware_class: HardwareClass,
    request: BuildRequest,
    graph_layout: str | None = None,
    pass_frames: int | None = None,
    external_data: bool = False,
) -> tuple[dict[str, tuple[Path, StepContract, ReferenceMatch | None]], dict[str, str]]:
    """Export (or keep) the ONNX step graphs of ``request``; returns ``{role: (path, contract, check)}`` and the model.

    CPU classes get one dynamic graph that every role runs (one copy of the weights); NPU classes a
    static graph per step size, or with ``one_step_graph`` (``rockchip_npu``) one graph at a symbolic
    B that the backend compiles for exactly the plan's step sizes; in the formulation
    ``graph_layout`` picks (``None``: the default one; the Rockchip builder passes
    ``time_on_height``, :mod:`vllm_omni.edge.graphs.npu_layout`), which is part of the kept graphs'
    fingerprint, like ``pass_frames`` (steps longer than that decode in equal passes,
    :class:`~vllm_omni.edge.graphs.npu_layout.Code2WavNpuStep`; a graph at a symbolic B has no
    passes, so a plan whose main step needs them gets a static graph per size). A kept graph
    (same checkpoint, same step sizes, same sha256 as recorded) is checked again in onnxruntime
    against the full decode when ``request.check`` is set (``check``: its :class:`ReferenceMatch`, else ``None``).
    ``external_data``: each graph keeps its weights in an ONNX external data file beside it
    (:func:`~vllm_omni.edge.backends.onnx.graph.external_data_name`), recorded and kept like the graph.
    """
    sizes = step_sizes(hardware_class, request)
    form = step_graph_form(hardware_class, request)
    needs_passes = pass_frames is not None and pass_frames < max(sizes.values())
    if form == "npu_dynamic" and (len(set(sizes.values())) < 2 or needs_passes):
        form = "npu"  # one step size, or a main step in passes: a static graph per size
    files = resolve_speech_tokenizer(request.model)
    fingerprint = {"checkpoint_sha256": checkpoint_sha256(files)}
    if graph_layout is not None:  # the CPU builds' fingerprint stays as it was
        fingerprint["graph_layout"] = graph_layout
    if pass_frames is not None:
        fingerprint["pass_frames"] = pass_frames
    if external_data:
        fingerprint["external_data"] = True
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_files(out_dir)  # a killed build's half-written graphs
    state = BuildState(out_dir / STATE_NAME, fingerprint, "steps")

    @cache
    def decoder() -> Qwen3TTSTokenizerV2Decoder:
        return load_code2wav_decoder(files.directory)

    if form == "cpu":  # one graph, B = 1 .. the largest step, checked on the plan's own mixed schedule
        jobs = {"step": (max(sizes.values()), sizes.get("first"), f"step_b1-{max(sizes.values())}.onnx")}
    elif form == "npu_dynamic":  # one graph, compiled for exactly the plan's step sizes (named after them)
        name = "step_" + "_".join(f"b{frames}" for frames in sorted(set(sizes.values()))) + ".onnx"
        jobs = {"step": (max(sizes.values()), sizes.get("first"), name)}
    else:
        jobs = {role: (frames, None, f"step_b{frames}.onnx") for role, frames in sizes.items()}
    built: dict[str, tuple[Path, StepContract, ReferenceMatch | None]] = {}
    for index, (job, (frames, first, name)) in enumerate(jobs.items(), start=1):
        label = f"[{index}/{len(jobs)}] {job if form == 'npu' else 'step graph'} B={frames}"
        path = out_dir / name
        data = path.with_name(external_data_name(path)) if external_data else None
        kept = all(state.intact(p.name, lambda _record, p=p: p) is not None for p in (path, data) if p is not None)
        if kept:
            request.progress(f"{label}: kept {path.name} ({path.stat().st_size / 1e6:.1f} MB, intact)")
        else:
            request.progress(f"{label}: exporting {path.name} ({form} form)")
            export_step_onnx(
                decoder(),
                frames,
                path,
                form=form,
                graph_layout=graph_layout,
                pass_frames=pass_frames,
                external_data=external_data,
            )
        match = None
        if request.check:  # kept graphs too: verification, not hope
            try:
                match = check_step_graph(decoder(), path, first_step_frames=first)
            except EdgeExportError:
                path.unlink(missing_ok=True)
                raise
        if not kept:
            for written in (path, data) if data is not None else (path,):
                state.record(written.name, {"sha256": file_sha256(written), "size_bytes": written.stat().st_size})
        contract = graph_contract(path)
        verdict = f"onnxruntime stepwise vs full decode: {match.describe()}" if match is not None else "not checked"
        request.progress(f"{label}: {path.name} N={contract.cache_numel}: {verdict}")
        built[job] = (path, contract, match)
    if "step" in built:  # one dynamic graph serves every role
        path, contract, match = built["step"]
        graphs = {role: (path, contract.for_frames(frames), match) for role, frames in sizes.items()}
    else:
        graphs = built
    model = {"id": model_label(request.model), "checkpoint_sha256": fingerprint["checkpoint_sha256"]}
    return graphs, model
