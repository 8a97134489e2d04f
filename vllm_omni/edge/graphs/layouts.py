"""Every formulation ("layout") of the stateful step graph, by the name a graph's metadata and a plan carry.

All of them compute the same function with the same contract and flat-cache layout
(:mod:`.step_contract`); they differ only in the operators a compiler or delegate is given:

- ``time_on_width`` (:class:`~.stateful.Code2WavStep`): the default; a dynamic graph of it is the
  CPU form onnxruntime runs;
- ``time_on_height`` (:class:`~.npu_layout.Code2WavNpuStep`): the waveform stage with time on the
  height axis, which keeps rknn-toolkit2's register fields in range; static, dynamic, or in passes;
- ``xnnpack_whole`` (:class:`~.phone_layout.Code2WavPhoneStep`): the ops ExecuTorch's XNNPACK
  partitioner delegates whole; a static step size only;
- ``webgpu`` (:class:`~.web_layout.Code2WavWebStep`): the CPU form with every sine and cosine a
  range-reduced polynomial (WGSL's own are loose) and int32 codes (no int64 node left for the CPU):
  the browser's graph, for onnxruntime-web's WebGPU and WASM providers alike.

This is the one registry of them. It imports no torch: the names and what each layout takes are
data (a CLI lists them without loading torch); a layout's step class is imported when it is asked
for (:meth:`GraphLayout.step_class`), by a plain import statement the import contracts see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import EdgeExportError

if TYPE_CHECKING:
    from .stateful import Code2WavStep

DEFAULT_LAYOUT = "time_on_width"
NPU_LAYOUT = "time_on_height"
PHONE_LAYOUT = "xnnpack_whole"
WEB_LAYOUT = "webgpu"


def _time_on_width() -> type[Code2WavStep]:
    from .stateful import Code2WavStep

    return Code2WavStep


def _time_on_height() -> type[Code2WavStep]:
    from .npu_layout import Code2WavNpuStep

    return Code2WavNpuStep


def _xnnpack_whole() -> type[Code2WavStep]:
    from .phone_layout import Code2WavPhoneStep

    return Code2WavPhoneStep


def _webgpu() -> type[Code2WavStep]:
    from .web_layout import Code2WavWebStep

    return Code2WavWebStep


@dataclass(frozen=True)
class GraphLayout:
    """One formulation of the step graph and what it can be asked for.

    ``exporter``: the export that traces it (``onnx``: :func:`vllm_omni.edge.backends.onnx.export.export_step_onnx`;
    ``executorch``: the phone step program). ``dynamic``: it traces at a symbolic B (one graph for several
    step sizes). ``passes``: it decodes a step in passes of fewer frames (``pass_frames``). ``forms``: the ONNX
    step forms it is exported in (:data:`vllm_omni.edge.backends.onnx.export.STEP_FORMS`; none for ExecuTorch).
    """

    name: str
    exporter: str
    dynamic: bool
    passes: bool
    summary: str
    load: Callable[[], type[Code2WavStep]]
    forms: tuple[str, ...] = ()

    def step_class(self) -> type[Code2WavStep]:
        """The ``nn.Module`` class of this layout (imports torch)."""
        return self.load()

    def make_step(self, decoder: Any, step_frames: int, *, dynamic: bool = False, pass_frames: int | None = None):
        """A step module of this layout for ``step_frames`` frames; an option it does not take is refused, naming
        the layouts that take it."""
        if dynamic and not self.dynamic:
            takers = ", ".join(name for name, layout in GRAPH_LAYOUTS.items() if layout.dynamic)
            raise EdgeExportError(
                f"the {self.name} layout traces one static step size; a dynamic graph needs one of: {takers}"
            )
        if pass_frames is not None and not self.passes:
            takers = " or ".join(name for name, layout in GRAPH_LAYOUTS.items() if layout.passes)
            raise EdgeExportError(f"pass_frames is for the {takers} layout, found layout {self.name!r}")
        options: dict[str, Any] = {"dynamic": dynamic} if self.dynamic else {}
        if pass_frames is not None:
            options["pass_frames"] = pass_frames
        return self.step_class()(decoder, step_frames, **options)


GRAPH_LAYOUTS: dict[str, GraphLayout] = {
    layout.name: layout
    for layout in (
        GraphLayout(
            DEFAULT_LAYOUT,
            "onnx",
            dynamic=True,
            passes=False,
            summary="time on the width axis",
            load=_time_on_width,
            forms=("cpu", "npu"),
        ),
        GraphLayout(
            NPU_LAYOUT,
            "onnx",
            dynamic=True,
            passes=True,
            summary="the waveform stage with time on the height axis (Rockchip NPU)",
            load=_time_on_height,
            forms=("npu", "npu_dynamic"),
        ),
        GraphLayout(
            PHONE_LAYOUT,
            "executorch",
            dynamic=False,
            passes=False,
            summary="the ops XNNPACK delegates whole (ExecuTorch on phones)",
            load=_xnnpack_whole,
        ),
        GraphLayout(
            WEB_LAYOUT,
            "onnx",
            dynamic=True,
            passes=False,
            summary="the CPU form with range-reduced polynomial sines (no sin or cos op), int32 codes (WebGPU, WASM)",
            load=_webgpu,
            forms=("cpu",),
        ),
    )
}


def get_layout(name: str) -> GraphLayout:
    """The layout called ``name``; :class:`EdgeExportError` listing the known ones otherwise."""
    layout = GRAPH_LAYOUTS.get(name)
    if layout is None:
        raise EdgeExportError(f"unknown step graph layout {name!r}; known: {', '.join(GRAPH_LAYOUTS)}")
    return layout


def layouts_for(exporter: str, form: str | None = None) -> tuple[str, ...]:
    """The names of the layouts ``exporter`` (``onnx`` or ``executorch``) traces, in registry order; with ``form``,
    those exported in that ONNX step form."""
    return tuple(
        name
        for name, layout in GRAPH_LAYOUTS.items()
        if layout.exporter == exporter and (form is None or form in layout.forms)
    )


def step_class(name: str) -> type[Code2WavStep]:
    """The step module class of the layout ``name`` (imports torch)."""
    return get_layout(name).step_class()
