"""Export stateful step graphs to ONNX (legacy exporter, opset 17) in a layout and form.

    path = export_step_onnx(decoder, step_frames=4, path="step_b4.onnx")

The export imports torch and the stateful wrapper inside the function; reading a graph back is
:mod:`.graph`'s.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import EdgeExportError
from ...files import write_atomically
from ...graphs.step_contract import INPUT_NAMES, OUTPUT_NAMES
from .graph import GRAPH_LAYOUT_KEY, PASS_FRAMES_KEY, external_data_name, onnx_module, op_report

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

logger = logging.getLogger(__name__)
DEFAULT_OPSET = 17
# "npu": static B, NPU-safe (rknn-toolkit2); "npu_dynamic": the same ops at a symbolic B (rknn-toolkit2's
# dynamic_input: one .rknn for a set of step sizes); "cpu": dynamic B, rewritten for onnxruntime (every B).
STEP_FORMS = ("npu", "npu_dynamic", "cpu")
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
    onnxruntime's fast kernels by :mod:`.cpu_rewrites`).
    ``graph_layout`` picks the formulation (:mod:`vllm_omni.edge.graphs.layouts`, an ONNX one); the default
    (``None``) carries no layout key; any other is recorded as ``qwen3_tts.graph_layout``.
    ``pass_frames`` (NPU layout only) decodes the step in equal passes of at most that many frames
    (:class:`~vllm_omni.edge.graphs.npu_layout.Code2WavNpuStep`), recorded as ``qwen3_tts.pass_frames``.

    ``external_data``: the weights go to ONNX external data, one file beside the graph named
    :func:`external_data_name` (``path``'s name + ``.data``), which the graph records; else the graph holds them.

    The graph is written under a temporary name; ``verify(temporary)`` (when given) runs before the
    rename, so a graph that fails its check never appears at ``path``
    (:func:`vllm_omni.edge.builders.onnx.steps.export_checked_step` checks against the full decode).
    """
    import torch

    from ...graphs.layouts import DEFAULT_LAYOUT, get_layout, layouts_for
    from .cpu_rewrites import optimize_for_cpu

    if form not in STEP_FORMS:
        raise EdgeExportError(f"unknown step graph form {form!r}; known: {', '.join(STEP_FORMS)}")
    onnx = onnx_module()
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
            # The legacy exporter is chosen on purpose (rknn-toolkit2's constant folding aborted on the decomposed
            # Pad, Exp, ConstantOfShape, Shape and Split patterns of the newer one); its deprecation notice, the
            # tracer's notes on Python-side values and constant folding's opset note are not for our users.
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
