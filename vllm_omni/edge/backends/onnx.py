"""Stateful step graphs as ONNX: export (legacy exporter, opset 17), op-set preflight, contract read-back.

    path = export_step_onnx(decoder, step_frames=4, path="step_b4.onnx")
    contract = graph_contract(path)           # B, N, head_dim, layout, ...

Module-level imports are torch-free so the RKNN converter venv can read contracts; the export
imports torch and the stateful wrapper inside the function.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EdgeExportError
from ..files import write_atomically
from ..graphs.step_contract import INPUT_NAMES, OUTPUT_NAMES, StepContract, StepContractError

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# "npu": static B, NPU-safe (rknn-toolkit2); "npu_dynamic": the same ops at a symbolic B (rknn-toolkit2's
# dynamic_input: one .rknn for a set of step sizes); "cpu": dynamic B, rewritten for onnxruntime (every B).
STEP_FORMS = ("npu", "npu_dynamic", "cpu")
# Ops that rknn-toolkit2 does not support or that broke conversions (DESIGN §4).
RKNN_RISK_OPS = ("IsNaN", "Neg", "Range", "Reciprocal", "Pad", "Exp", "ConstantOfShape", "Shape", "Split")
# The symbolic B of an npu_dynamic graph is read with Shape; rknn-toolkit2 2.5.0 folds that shape
# arithmetic for each step size it compiles (measured: one dynamic_input .rknn converts and checks).
DYNAMIC_SHAPE_OPS = ("Shape",)


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

    def risky_for(self, symbolic_b: bool) -> dict[str, int]:
        """The risk-list ops, less the shape reads that a graph at a symbolic B needs."""
        return {op: n for op, n in self.risky.items() if not (symbolic_b and op in DYNAMIC_SHAPE_OPS)}

    def summary(self) -> str:
        risky = ", ".join(f"{op} x{n}" for op, n in sorted(self.risky.items())) or "none"
        return f"{self.nodes} nodes, {len(self.op_counts)} op types; on the RKNN risk list: {risky}"


def op_report(path: str | os.PathLike[str]) -> OpReport:
    """Count the graph's nodes and the ops on the RKNN risk list (DESIGN §4)."""
    model = _onnx().load(str(path), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    return OpReport(sum(counts.values()), dict(counts), {op: counts[op] for op in RKNN_RISK_OPS if counts[op]})


def shape_nodes(path: str | os.PathLike[str]) -> set[str]:
    """The names of the nodes that compute only shapes: each reads a ``Shape``'s output, or values computed from
    shapes and constants alone. onnxruntime runs these on the CPU whatever the provider (they are host-side
    arithmetic on a few int64 values); every other node of a graph for a device's provider should run there."""
    model = _onnx().load(str(path), load_external_data=False)
    constant = {tensor.name for tensor in model.graph.initializer}
    from_shapes: set[str] = set()
    names: set[str] = set()
    for node in model.graph.node:  # topological order (ONNX requires it)
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant":
            constant.update(node.output)
        elif node.op_type == "Shape" or (
            inputs and all(n in constant or n in from_shapes for n in inputs) and any(n in from_shapes for n in inputs)
        ):
            from_shapes.update(node.output)
            names.add(node.name)
    return names


def external_data_name(path: str | os.PathLike[str]) -> str:
    """The name of a graph's external data file: the graph's name and ``.data``, beside it."""
    return f"{Path(path).name}.data"


def external_data_files(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The external data files a graph's initializers name (relative to the graph), in order; () for a graph that
    holds its weights."""
    model = _onnx().load(str(path), load_external_data=False)
    names: dict[str, None] = {}
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                names.setdefault(entry.value)
    return tuple(names)


GRAPH_LAYOUT_KEY = "qwen3_tts.graph_layout"
PASS_FRAMES_KEY = "qwen3_tts.pass_frames"


METADATA_FIELD = 14  # ModelProto.metadata_props: StringStringEntryProto, repeated


def _varint(handle: Any) -> int | None:
    """A protobuf varint read from ``handle``; None at the end of the file."""
    value, shift = 0, 0
    while byte := handle.read(1):
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    if shift:
        raise ValueError("the file ends inside a varint")
    return None


def graph_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """A graph file's ``metadata_props``, read without parsing the rest: the model's top-level fields are walked and
    every other one (the graph with any weights inside it) skipped by its length. A file that is not a well-formed
    protobuf is read by onnx instead, which says what is wrong with it."""
    from google.protobuf.message import DecodeError

    onnx = _onnx()
    recorded: dict[str, str] = {}
    try:
        with open(path, "rb") as handle:
            end = os.fstat(handle.fileno()).st_size
            while (key := _varint(handle)) is not None:
                field, wire = key >> 3, key & 7
                if wire == 0:
                    _varint(handle)
                elif wire in (1, 5):
                    handle.seek(8 if wire == 1 else 4, os.SEEK_CUR)
                elif wire == 2:
                    size = _varint(handle)
                    if field != METADATA_FIELD:
                        handle.seek(size, os.SEEK_CUR)
                        continue
                    entry = onnx.StringStringEntryProto.FromString(handle.read(size))
                    recorded[entry.key] = entry.value
                else:
                    raise ValueError(f"wire type {wire}")
                if handle.tell() > end:
                    raise ValueError("a field runs past the end of the file")
    except (ValueError, TypeError, DecodeError):
        model = onnx.load(str(path), load_external_data=False)
        return {prop.key: prop.value for prop in model.metadata_props}
    return recorded


def graph_formulation(path: str | os.PathLike[str]) -> tuple[str, int | None]:
    """``(graph layout, frames per pass)`` a step graph records (:func:`graph_metadata`: no parse of its weights).

    The layout is ``time_on_width`` when it records none; frames per pass ``None`` for one pass.
    """
    recorded = graph_metadata(path)
    passes = recorded.get(PASS_FRAMES_KEY)
    return recorded.get(GRAPH_LAYOUT_KEY, "time_on_width"), int(passes) if passes is not None else None


def graph_layout(path: str | os.PathLike[str]) -> str:
    """The formulation a step graph was exported with (``time_on_width`` when it records none)."""
    return graph_formulation(path)[0]


def graph_pass_frames(path: str | os.PathLike[str]) -> int | None:
    """Frames per pass of a step graph decoded in passes (``pass_frames``); ``None`` for one pass."""
    return graph_formulation(path)[1]


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


SHARED_CONSTANT_MIN_NUMEL = 4096  # weights; the small shape and scalar constants stay as exported


def share_identical_constants(model: Any) -> int:
    """Keep one copy of every weight-sized constant the graph holds more than once; returns how many went.

    Constant folding makes a tensor per use of a transformed weight (``weight[..., None]``, phase
    weights), so a step decoded in passes would carry the waveform weights once per pass. Identical
    initializers and ``Constant`` nodes (same type, shape and bytes) are merged into the first one,
    which precedes every use of the later ones in the node order.
    """
    import hashlib

    from onnx import numpy_helper

    def key(tensor) -> tuple:
        return tensor.data_type, tuple(tensor.dims), hashlib.sha256(numpy_helper.to_array(tensor).tobytes()).digest()

    graph, first, rename = model.graph, {}, {}
    initializers = []
    for tensor in graph.initializer:
        if math.prod(tensor.dims) < SHARED_CONSTANT_MIN_NUMEL:
            initializers.append(tensor)
            continue
        kept = first.setdefault(key(tensor), tensor.name)
        if kept != tensor.name:
            rename[tensor.name] = kept
        else:
            initializers.append(tensor)
    nodes = []
    for node in graph.node:
        values = [a for a in node.attribute if a.name == "value" and a.HasField("t")]
        if (
            node.op_type == "Constant"
            and len(node.attribute) == 1
            and values
            and math.prod(values[0].t.dims) >= SHARED_CONSTANT_MIN_NUMEL
        ):
            kept = first.setdefault(key(values[0].t), node.output[0])
            if kept != node.output[0]:
                rename[node.output[0]] = kept
                continue
        for index, name in enumerate(node.input):
            if name in rename:
                node.input[index] = rename[name]
        nodes.append(node)
    if rename:
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        del graph.node[:]
        graph.node.extend(nodes)
    return len(rename)


def export_step_onnx(
    decoder: Qwen3TTSTokenizerV2Decoder,
    step_frames: int,
    path: str | os.PathLike[str],
    opset: int = DEFAULT_OPSET,
    verify: Callable[[Path], Any] | None = None,
    form: str = "npu",
    graph_layout: str | None = None,
    pass_frames: int | None = None,
    external_data: bool = False,
) -> Path:
    """Export a step graph for ``step_frames``, with its contract in ``metadata_props``.

    ``form``: ``npu`` (static B, the formulation rknn-toolkit2 converts), ``npu_dynamic`` (the same
    formulation for any B up to ``step_frames``, which rknn-toolkit2 compiles for a set of step sizes
    into one ``.rknn``) or ``cpu`` (one graph for any B up to ``step_frames``, rewritten for
    onnxruntime's fast kernels by :mod:`.onnx_cpu`).
    ``graph_layout`` picks the formulation (:mod:`vllm_omni.edge.graphs.layouts`, an ONNX one); the default
    (``None``) carries no layout key; any other is recorded as ``qwen3_tts.graph_layout``.
    ``pass_frames`` (NPU layout only) decodes the step in equal passes of at most that many frames
    (:class:`~vllm_omni.edge.graphs.npu_layout.Code2WavNpuStep`), recorded as ``qwen3_tts.pass_frames``.

    ``external_data``: the weights go to ONNX external data, one file beside the graph named
    :func:`external_data_name` (``path``'s name + ``.data``), which the graph records; else the graph holds them.

    The graph is written under a temporary name; ``verify(temporary)`` (when given) runs before the
    rename, so a graph that fails its check never appears at ``path``
    (:func:`vllm_omni.edge.builders.steps.export_checked_step` checks against the full decode).
    """
    import torch

    from ..graphs.layouts import DEFAULT_LAYOUT, get_layout, layouts_for
    from .onnx_cpu import optimize_for_cpu

    if form not in STEP_FORMS:
        raise EdgeExportError(f"unknown step graph form {form!r}; known: {', '.join(STEP_FORMS)}")
    onnx = _onnx()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic = form != "npu"
    layout = get_layout(graph_layout or DEFAULT_LAYOUT)
    if layout.exporter != "onnx":
        raise EdgeExportError(
            f"the {layout.name} layout is exported by {layout.exporter}, not to ONNX; ONNX step graphs take "
            f"{', '.join(layouts_for('onnx'))}"
        )
    if form not in layout.forms:
        raise EdgeExportError(
            f"the {form} form takes the layouts {', '.join(layouts_for('onnx', form))}, not {layout.name!r}"
        )
    step = layout.make_step(decoder, step_frames, dynamic=dynamic, pass_frames=pass_frames).eval()
    dynamic_axes = (
        {"audio_codes": {2: "step_frames"}, "freqs_in": {0: "step_frames"}, "audio_values": {0: "samples"}}
        if dynamic
        else None
    )

    def write(temporary: Path) -> None:
        start = time.perf_counter()
        with torch.no_grad(), warnings.catch_warnings():
            # The legacy exporter is chosen on purpose (DESIGN §4); its deprecation notice, the tracer's
            # notes on Python-side values and constant folding's opset note are not for our users.
            warnings.filterwarnings(
                "ignore", message="You are using the legacy TorchScript", category=DeprecationWarning
            )
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Constant folding - Only steps=1", category=UserWarning)
            torch.onnx.export(
                step,
                step.example_inputs(),
                str(temporary),
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES),
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
                dynamic_axes=dynamic_axes,
            )
        model = onnx.load(str(temporary))
        rewrites = optimize_for_cpu(model) if form == "cpu" else {}
        rewrites["shared_constants"] = share_identical_constants(model)
        for key, value in step.contract.to_metadata().items():
            prop = model.metadata_props.add()
            prop.key, prop.value = key, value
        prop = model.metadata_props.add()
        prop.key, prop.value = "qwen3_tts.opset", str(opset)
        if graph_layout not in (None, DEFAULT_LAYOUT):
            prop = model.metadata_props.add()
            prop.key, prop.value = GRAPH_LAYOUT_KEY, graph_layout
        if getattr(step, "pass_frames", step_frames) < step_frames:
            prop = model.metadata_props.add()
            prop.key, prop.value = PASS_FRAMES_KEY, str(step.pass_frames)
        if external_data:  # onnx appends to an existing data file: start from none
            data = path.with_name(external_data_name(path))
            data.unlink(missing_ok=True)
            onnx.save(model, str(temporary), save_as_external_data=True, location=data.name, size_threshold=1024)
            os.chmod(data, 0o644)  # as the graph: a file to serve
        else:
            onnx.save(model, str(temporary))
        report = op_report(temporary)
        logger.info(
            "exported %s step %s (N=%d) in %.1f s: %s%s",
            form,
            f"B=1..{step_frames}" if dynamic else f"B={step_frames}",
            step.contract.cache_numel,
            time.perf_counter() - start,
            report.summary(),
            "".join(f"; {name} x{count}" for name, count in rewrites.items()),
        )
        risky = report.risky_for(symbolic_b=dynamic)
        if risky and form != "cpu":
            logger.warning(
                "step B=%d has ops on the RKNN risk list (%s); rknn-toolkit2 2.3.x aborted on such graphs, "
                "2.5.0 converted them in a probe",
                step_frames,
                ", ".join(risky),
            )
        if verify is not None:
            verify(temporary)

    return write_atomically(path, write)
