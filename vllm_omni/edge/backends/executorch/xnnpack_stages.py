"""XNNPACK partitions cut into stages of at most ``max_stage_bytes`` of weights, so a method loads in small steps.

An XNNPACK delegate packs its weights when its method loads, reading every weight it owns while
the packed copy is written: a delegate that owns the whole step (456 MB at the released
geometry) holds the unpacked and the packed weights at once, about twice the weights at peak.
:class:`StagedPartitioner` takes the partitions the XNNPACK partitioner chose and cuts each one,
in graph order, into runs whose constant inputs add up to at most ``max_stage_bytes``; each run
becomes its own delegate, packed and released before the next one loads.

A run of a partition in topological order is convex when the partition is (a path leaving a run
and coming back would pass a node of the same partition ordered between them, which is in the
same run), so the cut never makes a delegate the lowering cannot form. What the cut adds is one
hand-over of activations between consecutive stages: a few copies per step.
"""

from __future__ import annotations

from typing import Any

# Imported only by the ExecuTorch backend's partitioner factory, once executorch is known to be there.
from executorch.exir.backend.partitioner import Partitioner, PartitionResult

# Constants under this size (scalars, masks, norm weights) do not count against a stage's budget: they
# cost nothing at load, and cutting a stage for one would only add a hand-over.
SMALL_CONSTANT_BYTES = 4096


def constant_bytes(exported_program: Any) -> dict[str, int]:
    """Bytes of each lifted constant (parameter, buffer, tensor constant), by placeholder name."""
    signature = exported_program.graph_signature
    sources = {
        **{name: exported_program.state_dict.get(target) for name, target in signature.inputs_to_parameters.items()},
        **{  # a non-persistent buffer is kept with the constants
            name: exported_program.state_dict.get(target, exported_program.constants.get(target))
            for name, target in signature.inputs_to_buffers.items()
        },
        **{
            name: exported_program.constants.get(target)
            for name, target in signature.inputs_to_lifted_tensor_constants.items()
        },
    }
    return {name: tensor.numel() * tensor.element_size() for name, tensor in sources.items() if tensor is not None}


def cut_into_stages(exported_program: Any, partition_tags: dict[str, Any], max_stage_bytes: int) -> dict[str, Any]:
    """Re-tag the nodes of ``exported_program`` so no delegate owns more than ``max_stage_bytes`` of constants.

    ``partition_tags``: the partitioner's ``{tag: DelegationSpec}``. Returns the new tags (``{tag}_s{k}``).
    A single operator whose own weights exceed the budget forms a stage alone.
    """
    sizes = constant_bytes(exported_program)
    graph = exported_program.graph_module.graph
    stages: dict[str, tuple[int, int]] = {}  # partition tag -> (stage index, bytes in it)
    counted: set[str] = set()
    new_tags: dict[str, Any] = {}
    for node in graph.nodes:  # topological order
        tag = node.meta.get("delegation_tag") if node.op == "call_function" else None
        if tag is None:
            continue
        weights = [
            arg.name
            for arg in node.all_input_nodes
            if sizes.get(arg.name, 0) >= SMALL_CONSTANT_BYTES and arg.name not in counted
        ]
        added = sum(sizes[name] for name in weights)
        index, used = stages.get(tag, (0, 0))
        if added and used and used + added > max_stage_bytes:  # a node bringing no weights stays
            index, used = index + 1, 0
        stages[tag] = (index, used + added)
        counted.update(weights)
        staged = f"{tag}_s{index}"
        node.meta["delegation_tag"] = staged
        new_tags[staged] = partition_tags[tag]
    # The constants the partitioner gave a partition go with the stage of their first user there.
    for node in graph.nodes:
        tag = node.meta.get("delegation_tag") if node.op == "placeholder" else None
        if tag is None or tag in new_tags:
            continue
        users = [
            user.meta["delegation_tag"]
            for user in node.users
            if str(user.meta.get("delegation_tag", "")).startswith(f"{tag}_s")
        ]
        if users:
            node.meta["delegation_tag"] = min(users, key=lambda staged: int(staged.rsplit("_s", 1)[1]))
        else:
            node.meta.pop("delegation_tag")
    return new_tags


class StagedPartitioner(Partitioner):
    """Asks ``inner`` for its partitions, then cuts them into stages (:func:`cut_into_stages`)."""

    def __init__(self, inner: Partitioner, max_stage_bytes: int):
        if max_stage_bytes < 1:
            raise ValueError(f"max_stage_bytes must be >= 1, found {max_stage_bytes}")
        super().__init__(inner.spec)
        self.inner = inner
        self.max_stage_bytes = max_stage_bytes

    def partition(self, exported_program: Any) -> PartitionResult:
        result = self.inner.partition(exported_program)
        tags = cut_into_stages(result.tagged_exported_program, result.partition_tags, self.max_stage_bytes)
        return PartitionResult(tagged_exported_program=result.tagged_exported_program, partition_tags=tags)

    def ops_to_not_decompose(self, ep: Any) -> Any:
        return self.inner.ops_to_not_decompose(ep)
