"""Lower ``torch.export`` programs to a ``.pte`` with a delegate partitioner (:class:`ExecuTorchProgramWriter`).

``xnnpack`` (CPU, every phone) ships with the ``executorch`` package. ``coreml`` (Apple Neural
Engine) needs coremltools with Apple's CoreML framework (macOS); where that is missing this says
so and stops: it never falls back to another partitioner. Qualcomm's QNN is not offered: it needs
a compile spec per SoC, which this tool does not have yet, so it is not listed as a partitioner.

One program may hold several methods (:meth:`ExecuTorchProgramWriter.write_methods`): a window per
method, or a stateful step per step size. They are lowered together, and XNNPACK keeps each weight
once in the program's named data (keyed by content), so the methods share one copy of the weights
(measured: a two-step program is 1.02x the size of one step).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ...files import write_atomically
from ..interface import BackendUnavailableError
from .delegation import count_flops, delegation_report
from .program import SINGLE_METHOD, metadata_method, require_executorch

PARTITIONERS = ("xnnpack", "coreml", "none")
MAX_STAGE_BYTES = 32 * 2**20  # the most weights one XNNPACK delegate owns (a load packs one stage at a time)


def _coreml_partitioner() -> Any:
    try:
        import coremltools.libcoremlpython  # noqa: F401  (the CoreML framework itself, absent off macOS)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--partitioner coreml needs coremltools with Apple's CoreML framework (macOS); this {sys.platform} host "
            f"has none ({exc}). Export on a Mac, or use --partitioner xnnpack"
        ) from exc
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    return CoreMLPartitioner()


def _xnnpack_partitioner(max_stage_bytes: int) -> Any:
    """XNNPACK's partitions, cut into stages of at most ``max_stage_bytes`` of weights (:mod:`.xnnpack_stages`)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from .xnnpack_stages import StagedPartitioner

    return StagedPartitioner(XnnpackPartitioner(), max_stage_bytes)


_PARTITIONER_FACTORIES = {
    "xnnpack": _xnnpack_partitioner,
    "coreml": lambda _max_stage_bytes: _coreml_partitioner(),
    "none": lambda _max_stage_bytes: None,
}


class ExecuTorchProgramWriter:
    name = "executorch"
    suffix = ".pte"

    def __init__(self, partitioner: str = "xnnpack", max_stage_bytes: int = MAX_STAGE_BYTES):
        """``max_stage_bytes``: the most weights one XNNPACK delegate owns (it packs them all at once when its
        method loads; :mod:`.xnnpack_stages`)."""
        if partitioner not in _PARTITIONER_FACTORIES:
            raise BackendUnavailableError(f"unknown partitioner {partitioner!r}; known: {', '.join(PARTITIONERS)}")
        require_executorch()
        self.partitioner = partitioner
        self.max_stage_bytes = max_stage_bytes
        self._partitioner = _PARTITIONER_FACTORIES[partitioner](max_stage_bytes)  # fails now, before any export

    def write_program(self, exported: Any, metadata: dict[str, int], path: Path) -> dict[str, int]:
        """One program, ``forward``, with its metadata as bare constant methods."""
        return self.write_methods({SINGLE_METHOD: (exported, metadata)}, path)[SINGLE_METHOD]

    def write_methods(self, methods: dict[str, tuple[Any, dict[str, Any]]], path: Path) -> dict[str, dict[str, int]]:
        """Lower ``{method: (ExportedProgram, metadata)}`` together into one program at ``path``.

        The methods share the weights (stored once); each method's ``metadata`` becomes constant
        methods ``{method}__{key}`` (bare keys for a lone ``forward``). Returns op counts per method,
        with its :class:`~.delegation.DelegationReport` as JSON under ``delegation``.
        """
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import to_edge_transform_and_lower

        partitioners = [self._partitioner] if self._partitioner is not None else []
        constants = {
            metadata_method(method, key): value
            for method, (_, metadata) in methods.items()
            for key, value in metadata.items()
        }
        clashes = set(constants) & set(methods)
        if clashes:
            raise BackendUnavailableError(f"method names {sorted(clashes)} clash with metadata methods; rename them")
        exported = {method: program for method, (program, _) in methods.items()}
        flops = {method: count_flops(ep.module(), ep.example_inputs[0]) for method, ep in exported.items()}
        edge = to_edge_transform_and_lower(exported, partitioner=partitioners, constant_methods=constants)
        ops = {}
        for method in methods:
            lowered = edge.exported_program(method).graph_module
            info = get_delegation_info(lowered)
            report = delegation_report(method, self.partitioner, lowered, flops[method])
            ops[method] = {
                "delegated": int(info.num_delegated_nodes),
                "portable": int(info.num_non_delegated_nodes),
                "delegate_subgraphs": int(info.num_delegated_subgraphs),
                "delegation": report.to_json(),
            }
        program = edge.to_executorch()

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as handle:
                program.write_to_file(handle)

        write_atomically(path, write)
        return ops
