"""Suggest a hardware class for the machine this runs on (from /proc, the platform and installed runtimes).

``VLLM_OMNI_EDGE_HARDWARE=CLASS`` overrides the guess (and must name a known class). The guess
is a suggestion for a person or a device-side client, never a silent choice inside a build.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from .registry import ROCKCHIP_TARGETS, get_hardware_class

OVERRIDE_ENV = "VLLM_OMNI_EDGE_HARDWARE"
DEVICE_TREE_COMPATIBLE = Path("/proc/device-tree/compatible")
ANDROID_MARKERS = (Path("/system/build.prop"), Path("/system/bin/app_process"))


@dataclass(frozen=True)
class Detection:
    hardware_class: str
    reason: str
    target: str | None = None


def _rockchip_soc(compatible: Path) -> str | None:
    try:
        entries = compatible.read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in entries:
        vendor, _, soc = entry.decode(errors="replace").partition(",")
        if vendor == "rockchip" and soc in ROCKCHIP_TARGETS:
            return soc
    return None


def detect(
    environ: dict[str, str] | None = None,
    compatible: Path = DEVICE_TREE_COMPATIBLE,
    machine: str | None = None,
) -> Detection:
    """The class to suggest, with the reason. Arguments exist so tests can describe another machine."""
    environ = os.environ if environ is None else environ
    override = environ.get(OVERRIDE_ENV)
    if override:
        get_hardware_class(override)  # unknown name: the error lists the known ones
        return Detection(override, f"set by {OVERRIDE_ENV}")
    soc = _rockchip_soc(compatible)
    if soc is not None:
        runtime = "rknn-toolkit-lite2 installed" if importlib.util.find_spec("rknnlite") else "no rknnlite yet"
        return Detection("rockchip_npu", f"{compatible} names rockchip,{soc} ({runtime})", soc)
    if "ANDROID_ROOT" in environ or any(marker.exists() for marker in ANDROID_MARKERS):
        return Detection("npu_phone", "Android (ANDROID_ROOT or /system markers)")
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return Detection("cpu_arm64", f"{machine} CPU, no NPU found")
    if machine in ("x86_64", "amd64"):
        return Detection("cpu_x86_64", f"{machine} CPU, no NPU found")
    return Detection("cpu_x86_64", f"unrecognised machine {machine!r}; the x86_64 CPU class is the fallback guess")
