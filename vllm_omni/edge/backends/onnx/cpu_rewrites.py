"""Rewrites that give onnxruntime's CPU kernels their fast paths; the graph computes the same function.

- **1-D convolutions as 2-D** (height 1): onnxruntime runs 1-D ``Conv``/``ConvTranspose`` through
  im2col + GEMM, while its NCHWc layout pass (graph optimization level ``ALL``) turns 2-D
  convolutions into blocked direct convolutions. On this project's waveform blocks (kernel 7,
  dilations 1/3/9, 96-384 channels, 2,560-30,720 samples per step) that measured 1.7-2.7x the
  GFLOP/s of the 1-D form (``benchmarks/bench_stateful.py`` prints the conv peak of both).
- **Pow(x, 2) as Mul(x, x)**: SnakeBeta squares a sine; a generic ``Pow`` costs a ``powf`` per
  element, a ``Mul`` does not.

Only torch-free ``onnx`` here; :func:`optimize_for_cpu` is applied to the step graphs of the CPU
classes (the NPU graphs keep the form rknn-toolkit2 was validated on).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...errors import EdgeExportError

AXIS_NAME = "qwen3_tts.cpu.axis2"  # the initializer both Unsqueeze and Squeeze read (opset >= 13)


def optimize_for_cpu(model: Any) -> dict[str, int]:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place; returns how many nodes each rewrite changed."""
    counts = {"constants_as_initializers": constants_as_initializers(model)}
    counts |= {"conv_as_2d": convolutions_as_2d(model), "square_as_mul": squares_as_mul(model)}
    counts["unused_initializers"] = remove_unused_initializers(model)
    return counts


def constants_as_initializers(model: Any) -> int:
    """``Constant`` nodes holding a tensor become initializers (the exporter emits module buffers as such nodes),
    so the rewrites below see every constant weight."""
    graph = model.graph
    nodes, moved = [], 0
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = type(node.attribute[0].t)()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            moved += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return moved


def remove_unused_initializers(model: Any) -> int:
    """Drop initializers no node reads (the tracer leaves some; onnxruntime warns about each at load)."""
    graph = model.graph
    used = {name for node in graph.node for name in node.input} | {output.name for output in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    removed = len(graph.initializer) - len(kept)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return removed


def _opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def convolutions_as_2d(model: Any) -> int:
    """Every ``Conv``/``ConvTranspose`` with a constant 3-D weight becomes Unsqueeze -> 2-D op -> Squeeze."""
    import numpy as np
    from onnx import helper, numpy_helper

    if _opset(model) < 13:
        raise EdgeExportError(f"the CPU conv rewrite needs opset >= 13 (axes as inputs), the graph has {_opset(model)}")
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    nodes, rewritten = [], 0
    for node in graph.node:
        weight = initializers.get(node.input[1]) if node.op_type in ("Conv", "ConvTranspose") else None
        if weight is None or len(weight.dims) != 3:
            nodes.append(node)
            continue
        if rewritten == 0:
            graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), AXIS_NAME))
        values = numpy_helper.to_array(weight)[:, :, None, :]
        if uses[weight.name] == 1:
            weight.CopyFrom(numpy_helper.from_array(values, weight.name))
            name = weight.name
        else:  # a weight shared with another node keeps its 3-D form for it
            name = f"{weight.name}.as_2d"
            if name not in initializers:
                initializers[name] = numpy_helper.from_array(values, name)
                graph.initializer.append(initializers[name])
        attributes = {}
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            if attribute.name in ("kernel_shape", "strides", "dilations", "output_padding"):
                value = [1, *value]
            elif attribute.name == "pads":
                value = [0, value[0], 0, value[1]]
            elif attribute.name == "output_shape":
                value = [1, *value]
            attributes[attribute.name] = value
        lifted, result = f"{node.output[0]}.as_2d_in", f"{node.output[0]}.as_2d_out"
        nodes.append(helper.make_node("Unsqueeze", [node.input[0], AXIS_NAME], [lifted]))
        nodes.append(helper.make_node(node.op_type, [lifted, name, *node.input[2:]], [result], node.name, **attributes))
        nodes.append(helper.make_node("Squeeze", [result, AXIS_NAME], [node.output[0]]))
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def squares_as_mul(model: Any) -> int:
    """``Pow(x, 2)`` (a constant exponent of exactly 2) becomes ``Mul(x, x)``."""
    from onnx import helper, numpy_helper

    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    rewritten = 0
    for index, node in enumerate(graph.node):
        exponent = constants.get(node.input[1]) if node.op_type == "Pow" else None
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0:
            graph.node[index].CopyFrom(helper.make_node("Mul", [node.input[0], node.input[0]], node.output, node.name))
            rewritten += 1
    return rewritten
