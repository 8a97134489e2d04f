"""The builders by name (what a hardware class's ``builder`` and ``other_graphs`` name), and :func:`build`.

A builder is called as ``builder(hardware_class, request) -> ExecPlan`` and is resumable: an artifact
already in ``out_dir`` whose recorded sha256 still matches (and was built from the same checkpoint) is
kept and checked again instead of rebuilt. The plan is written last, and only after it validates
against the files.

A built-in builder is named as the module or folder of this package that holds it, and is its ``build``
(``windowed.build``; ``onnx/build.py``'s ``build`` for ``onnx``, and so on):

- ``windowed`` (:mod:`.windowed`): windowed programs, ExecuTorch ``.pte`` or torch.export ``.pt2``;
- ``onnx`` (:mod:`.onnx`): stateful ONNX step graphs, each checked in onnxruntime against the full decode;
- ``executorch`` (:mod:`.executorch`): the stateful step as one multi-method ExecuTorch program
  (``npu_phone --graph stateful``), checked in the ExecuTorch runtime;
- ``rknn`` (:mod:`.rknn`): the same ONNX steps compiled to fp16 ``.rknn`` and checked in the rknn-toolkit2
  simulator, in the converter venv.

The hardware registry holds these names only, so the dependency points down: this module imports the
hardware classes and the builders, the hardware layer imports neither. Other packages add builders
through the ``vllm_omni.edge.builders`` entry-point group, each entry point resolving to such a
callable; a hardware class from a plugin names one as a built-in class names its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..entry_points import PluginGroup
from ..errors import EdgeExportError
from ..graphs.window_contract import check_ramp
from ..hardware.registry import HardwareClass
from ..plan.model import ExecPlan
from . import windowed
from .executorch import build as executorch
from .onnx import build as onnx
from .onnx.build import stale_formulation as stale_formulation  # the start-up hand-off asks it here (its one import)
from .request import BuildArgumentError, BuildRequest, check_out_dir, class_default
from .rknn import build as rknn

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_omni.edge.builders"

Builder = Callable[[HardwareClass, BuildRequest], ExecPlan]
BUILTIN_BUILDERS: dict[str, Builder] = {
    "windowed": windowed.build,
    "onnx": onnx.build,
    "executorch": executorch.build,
    "rknn": rknn.build,
}


class UnknownBuilderError(EdgeExportError):
    """A builder name that is neither built in nor registered by an entry point; the message lists the known ones."""


def _builder(name: str, value: Any) -> Builder:
    if not callable(value):
        raise UnknownBuilderError(f"builder plugin {name!r} gave {type(value).__name__}, not a callable")
    return value


PLUGINS = PluginGroup(ENTRY_POINT_GROUP, BUILTIN_BUILDERS, "builder", UnknownBuilderError, _builder)


def builder_names() -> tuple[str, ...]:
    """Every known builder: the built-in ones, then those registered by entry points."""
    return PLUGINS.names()


def get_builder(name: str) -> Builder:
    """The builder called ``name``; raises :class:`UnknownBuilderError` naming the known ones."""
    return BUILTIN_BUILDERS[name] if name in BUILTIN_BUILDERS else PLUGINS.load(name)


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """Build every artifact of ``hardware_class`` and return its validated plan.

    The request's sizes and output directory are checked first (:class:`~.request.BuildArgumentError`,
    :class:`~vllm_omni.edge.graphs.window_contract.WindowConfigError`), and the builder is looked up
    (:class:`UnknownBuilderError`), before any work.
    """
    graph_kind = request.graph or hardware_class.graph_kind
    if graph_kind not in hardware_class.graph_kinds:
        raise BuildArgumentError(
            f"--graph {graph_kind}: {hardware_class.name} builds {' or '.join(hardware_class.graph_kinds)} graphs; "
            "choose one of those (or another hardware class)"
        )
    check_out_dir(request.out_dir, request.force)
    if graph_kind == "windowed":
        check_ramp(
            class_default(request.ramp, hardware_class, "ramp"),
            class_default(request.context_frames, hardware_class, "context_frames"),
        )
    try:
        builder = get_builder(hardware_class.builder_for(graph_kind))
    except UnknownBuilderError as exc:
        raise UnknownBuilderError(f"hardware class {hardware_class.name!r}: {exc}") from exc
    return builder(hardware_class, request)
