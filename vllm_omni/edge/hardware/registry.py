"""Hardware classes: what a class of device decodes with, as a small declarative record.

A class names the graph kind (windowed or stateful), the backend that runs it, the dtype, its
default sizes and targets, and the builder that produces its artifacts. Both are *names*: the
backend one in :mod:`vllm_omni.edge.backends.registry`, the builder one in
:mod:`vllm_omni.edge.builders.registry`, which the layers above resolve; this layer is data only and
imports nothing above it, so listing classes needs no toolchain. Built-in classes are below; other
packages add classes through the ``vllm_omni.edge.hardware_classes`` entry-point group, each entry
point resolving to a :class:`HardwareClass` (or a zero-argument callable returning one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any

from ..errors import EdgeError

logger = logging.getLogger(__name__)

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
    # A name in vllm_omni.edge.builders.registry (built in: windowed, onnx_steps, executorch_steps, rknn), whose
    # builder is called as builder(hardware_class, request).
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


# Measured at the released geometry with random weights, XNNPACK on this 2-core x86 host
# (benchmarks/bench_phone.py; docs/windowed_programs.md has the table).
PHONE_GRAPH_NOTES = {
    "windowed": "exact only while the stream fits the 72-frame context (5.76 s): 28.3 dB vs the full decode on a "
    "20 s stream; recomputes the context every chunk (37x the minimum compute at chunk 2, 3.9x at 25); windows.pte "
    "1.00x the weights",
    "stateful": "exact at any length (104.9 dB vs the full decode on a 20 s stream, in ExecuTorch); the whole step in "
    "XNNPACK (100% of the FLOPs, 0.02% of the step's time outside); RTF 0.21 on 2 threads, 0.72x the onnxruntime "
    "step (released geometry, this 2-core host); decoder RSS 1.3x the weights (one packed copy); steps.pte 1.00x the "
    "weights",
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
        other_graphs={"stateful": "executorch_steps"},
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
        builder="onnx_steps",
        defaults={"first_step_frames": 2, "step_frames": 16},
    ),
    HardwareClass(
        name="cpu_arm64",
        description="arm64 CPU (boards, Apple silicon, phones without an NPU plan): one stateful ONNX step graph "
        "for every step size, on onnxruntime (exact)",
        graph_kind="stateful",
        backend="onnxruntime",
        dtype="fp32",
        builder="onnx_steps",
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
        builder="onnx_steps",
        # external_data: the weights in a file beside the graph, which onnxruntime-web takes without parsing them out
        # of the graph (on WebGPU straight to GPU buffers): the page's peak memory stays near the weights
        defaults={"first_step_frames": 2, "step_frames": 16, "graph_layout": "webgpu", "external_data": True},
    ),
)


def _entry_point_classes() -> list[HardwareClass]:
    found = []
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = entry_point.load()
            record = value() if callable(value) and not isinstance(value, HardwareClass) else value
        except Exception as exc:  # a broken plugin must not take the built-in classes down with it
            logger.warning("hardware class plugin %r failed to load: %s", entry_point.name, exc)
            continue
        if not isinstance(record, HardwareClass):
            logger.warning("hardware class plugin %r gave %s, not a HardwareClass", entry_point.name, type(record))
            continue
        found.append(record)
    return found


@cache
def hardware_classes() -> dict[str, HardwareClass]:
    """Every known class by name: the built-in ones, then those registered by entry points."""
    classes = {record.name: record for record in BUILTIN_CLASSES}
    for record in _entry_point_classes():
        if record.name in classes:
            logger.warning("hardware class plugin %r is shadowed by an existing class of that name", record.name)
            continue
        classes[record.name] = record
    return classes


def get_hardware_class(name: str) -> HardwareClass:
    classes = hardware_classes()
    if name not in classes:
        raise UnknownHardwareClassError(f"unknown hardware class {name!r}; known: {', '.join(classes)}")
    return classes[name]
