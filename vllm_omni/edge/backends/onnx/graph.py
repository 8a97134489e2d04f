"""Read a step graph back, torch-free: its contract, layout, op counts, shape nodes and external data.

    contract = graph_contract(path)           # B, N, head_dim, layout, ...

The builds, the converter venv and a server's start-up (:func:`graph_layout` of a plan on disk) read graphs
through this module; it needs ``onnx`` and no torch. A device does not: onnxruntime reads the file itself.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import EdgeExportError
from ...graphs.layouts import DEFAULT_LAYOUT
from ...graphs.step_contract import INPUT_NAMES, OUTPUT_NAMES, StepContract, StepContractError

# Ops that rknn-toolkit2 does not support (IsNaN, Neg, Range, Reciprocal) or whose decomposed patterns from recent
# torch exporters aborted its fold_constant pass (Pad, Exp, ConstantOfShape, Shape, Split).
RKNN_RISK_OPS = ("IsNaN", "Neg", "Range", "Reciprocal", "Pad", "Exp", "ConstantOfShape", "Shape", "Split")
# The symbolic B of an npu_dynamic graph is read with Shape; rknn-toolkit2 2.5.0 folds that shape
# arithmetic for each step size it compiles (measured: one dynamic_input .rknn converts and checks).
DYNAMIC_SHAPE_OPS = ("Shape",)


def onnx_module():
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
    """Count the graph's nodes and the ops on the RKNN risk list (:data:`RKNN_RISK_OPS`)."""
    model = onnx_module().load(str(path), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    return OpReport(sum(counts.values()), dict(counts), {op: counts[op] for op in RKNN_RISK_OPS if counts[op]})


def shape_nodes(path: str | os.PathLike[str]) -> set[str]:
    """The names of the nodes that compute only shapes: each reads a ``Shape``'s output, or values computed from
    shapes and constants alone. onnxruntime runs these on the CPU whatever the provider (they are host-side
    arithmetic on a few int64 values); every other node of a graph for a device's provider should run there."""
    model = onnx_module().load(str(path), load_external_data=False)
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
    model = onnx_module().load(str(path), load_external_data=False)
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

    onnx = onnx_module()
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

    The layout is the default one (``time_on_width``, the layout of graphs from before layouts were recorded) when it
    records none; frames per pass ``None`` for one pass.
    """
    recorded = graph_metadata(path)
    passes = recorded.get(PASS_FRAMES_KEY)
    return recorded.get(GRAPH_LAYOUT_KEY, DEFAULT_LAYOUT), int(passes) if passes is not None else None


def graph_layout(path: str | os.PathLike[str]) -> str:
    """The formulation a step graph was exported with (``time_on_width`` when it records none)."""
    return graph_formulation(path)[0]


def graph_pass_frames(path: str | os.PathLike[str]) -> int | None:
    """Frames per pass of a step graph decoded in passes (``pass_frames``); ``None`` for one pass."""
    return graph_formulation(path)[1]


def graph_contract(path: str | os.PathLike[str]) -> StepContract:
    """Read the step contract (B, N, head_dim, cache layout, ...) back out of a step graph file."""
    onnx = onnx_module()
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
