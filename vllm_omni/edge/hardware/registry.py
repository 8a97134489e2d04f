"""Hardware classes: what a class of device decodes with, as a small declarative record.

A class names the graph kind (windowed or stateful), the backend that runs it, the dtype, its
default sizes and targets, and the builder that produces its artifacts. Both are *names*: the
backend one in :mod:`vllm_omni.edge.backends.registry`, the builder one in
:mod:`vllm_omni.edge.builders.registry`, which the layers above resolve; this layer is data only and
imports nothing above it, so listing classes needs no toolchain. Built-in classes are below; other
packages add classes through the ``vllm_omni.edge.hardware_classes`` entry-point group, each entry
point resolving to a :class:`HardwareClass` of the entry point's name (or a zero-argument callable returning one);
loading and the failure policy are :mod:`..entry_points`' (one for every registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ..entry_points import PluginGroup
from ..errors import EdgeError

ENTRY_POINT_GROUP = "vllm_omni.edge.hardware_classes"
ROCKCHIP_TARGETS = ("rk3588", "rk3576", "rk3562", "rk3566", "rk3568")


class UnknownHardwareClassError(EdgeError, KeyError):
    """No hardware class of that name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class HardwareClass:
    """One class of device. ``defaults`` are the builder's sizes (ramp/context, or step frames)."""

    name: str
    description: str
    graph_kind: str  # "windowed" | "stateful"
    backend: str  # a name in vllm_omni.edge.backends.registry (built in: executorch, rknn, onnxruntime, torch_export)
    dtype: str
    # A name in vllm_omni.edge.builders.registry (built in: windowed, onnx, executorch, rknn, each named as the
    # builders module or folder that holds it), whose builder is called as builder(hardware_class, request).
    builder: str
    defaults: dict[str, Any] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    default_target: str | None = None
    variants: dict[str, str] = field(default_factory=dict)  # e.g. partitioner -> what it needs
    # Other graph kinds the class builds on request (``build --graph KIND``): kind -> builder name. The
    # backend must run that kind too; ``graph_kind`` stays the class's default and published contract.
    other_graphs: dict[str, str] = field(default_factory=dict)
    # Measured quality and cost per graph kind (what `hardware list` shows a user choosing one).
    graph_notes: dict[str, str] = field(default_factory=dict)
    # What a build of this class checks and reports beyond the graph (one line in `hardware list`).
    build_note: str = ""

    @property
    def graph_kinds(self) -> tuple[str, ...]:
        """Every graph kind this class builds, its default first."""
        return (self.graph_kind, *(kind for kind in self.other_graphs if kind != self.graph_kind))

    def builder_for(self, graph_kind: str | None = None) -> str:
        """The name of the builder of ``graph_kind`` (the class's default kind when ``None``)."""
        kind = graph_kind or self.graph_kind
        if kind not in self.graph_kinds:
            raise EdgeError(f"hardware class {self.name!r} builds {' or '.join(self.graph_kinds)} graphs, not {kind!r}")
        return self.builder if kind == self.graph_kind else self.other_graphs[kind]


# What each graph kind gives up or keeps, as `hardware list` shows it. Measured numbers live in the benchmarks'
# output and their docs (docs/windowed_programs.md#phones-windowed-or-stateful: `python -m benchmarks.bench_phone`).
PHONE_GRAPH_NOTES = {
    "windowed": "exact only while the stream fits the context window (context_frames); recomputes the context every "
    "chunk; one windows.pte holding the weights once",
    "stateful": "exact at any length, each frame computed once; the whole step in XNNPACK, one packed copy of the "
    "weights; one steps.pte holding the weights once (measured: docs/windowed_programs.md)",
}

BUILTIN_CLASSES = (
    HardwareClass(
        name="npu_phone",
        description="phone NPU: ExecuTorch, one program holding the weights once (XNNPACK; CoreML export on "
        "macOS): windowed programs, a method per chunk size of the ramp (default), or the exact stateful step "
        "(--graph stateful, a method per step size)",
        graph_kind="windowed",
        backend="executorch",
        dtype="fp32",
        builder="windowed",
        defaults={
            "ramp": (2, 4, 8, 16, 25),
            "context_frames": 72,
            "partitioner": "xnnpack",
            "one_program": True,
            "first_step_frames": 2,
            "step_frames": 16,
        },
        variants={"xnnpack": "always", "coreml": "macOS with coremltools"},
        other_graphs={"stateful": "executorch"},
        graph_notes=PHONE_GRAPH_NOTES,
    ),
    HardwareClass(
        name="rockchip_npu",
        description="Rockchip NPU: fp16 RKNN stateful step graphs (first + main step sharing one cache), per SoC",
        graph_kind="stateful",
        backend="rknn",
        dtype="fp16",
        builder="rknn",
        # one_step_graph: one .rknn compiled with dynamic_input for both step sizes (one copy of the weights)
        defaults={"first_step_frames": 2, "step_frames": 16, "one_step_graph": True},
        targets=ROCKCHIP_TARGETS,
        default_target="rk3588",
        build_note="reports the op placement in the plan and <rknn>.report.json; an op on the CPU off the "
        "target's allow-list, or one without a lowering, fails it (the converter's --allow-cpu-ops keeps it)",
    ),
    HardwareClass(
        name="cpu_x86_64",
        description="x86_64 CPU: one stateful ONNX step graph for every step size, on onnxruntime (exact)",
        graph_kind="stateful",
        backend="onnxruntime",
        dtype="fp32",
        builder="onnx",
        defaults={"first_step_frames": 2, "step_frames": 16},
    ),
    HardwareClass(
        name="cpu_arm64",
        description="arm64 CPU (boards, Apple silicon, phones without an NPU plan): one stateful ONNX step graph "
        "for every step size, on onnxruntime (exact)",
        graph_kind="stateful",
        backend="onnxruntime",
        dtype="fp32",
        builder="onnx",
        defaults={"first_step_frames": 2, "step_frames": 16},
    ),
    HardwareClass(
        name="browser",
        description="web page: one stateful ONNX step graph in the webgpu layout (the CPU form, sines as "
        "range-reduced polynomials, int32 codes), which the page served at /edge/browser/ runs in onnxruntime-web in a "
        "Web Worker, on WebGPU where the browser has an adapter and on WASM otherwise; onnxruntime in Python checks "
        "and decodes the same plan (exact)",
        graph_kind="stateful",
        backend="onnxruntime",
        dtype="fp32",
        builder="onnx",
        # external_data: the weights in a file beside the graph, which onnxruntime-web takes without parsing them out
        # of the graph (on WebGPU straight to GPU buffers): the page's peak memory stays near the weights
        defaults={"first_step_frames": 2, "step_frames": 16, "graph_layout": "webgpu", "external_data": True},
    ),
)


def _hardware_class(name: str, value: Any) -> HardwareClass:
    """A plugin's class: the :class:`HardwareClass` it names (or a zero-argument callable returns), named as its
    entry point is."""
    try:
        record = value() if callable(value) and not isinstance(value, HardwareClass) else value
    except Exception as exc:  # a plugin's factory may fail in any way; say which one
        raise UnknownHardwareClassError(f"hardware class plugin {name!r} failed to load: {exc}") from exc
    if not isinstance(record, HardwareClass):
        raise UnknownHardwareClassError(
            f"hardware class plugin {name!r} gave {type(record).__name__}, not a HardwareClass"
        )
    if record.name != name:
        raise UnknownHardwareClassError(
            f"hardware class plugin {name!r} gave a class named {record.name!r}: name the entry point as its class"
        )
    return record


PLUGINS = PluginGroup(
    ENTRY_POINT_GROUP,
    [record.name for record in BUILTIN_CLASSES],
    "hardware class",
    UnknownHardwareClassError,
    _hardware_class,
)


@cache
def hardware_classes() -> dict[str, HardwareClass]:
    """Every known class by name: the built-in ones, then those registered by entry points (a broken one skipped)."""
    return {**{record.name: record for record in BUILTIN_CLASSES}, **PLUGINS.load_all()}


def get_hardware_class(name: str) -> HardwareClass:
    """The class called ``name``; raises :class:`UnknownHardwareClassError` naming the known ones, or the plugin
    of that name that failed to load."""
    for record in BUILTIN_CLASSES:
        if record.name == name:
            return record  # no plugin is imported to answer for a built-in class
    return PLUGINS.load(name)  # that plugin alone; unknown or broken: the error naming it
