"""The hardware-class registry and ``detect()``: what each class of device decodes with (data only).

A class names its backend and its builder; :mod:`vllm_omni.edge.backends.registry` and
:mod:`vllm_omni.edge.builders.registry` resolve the names, so this package imports nothing above it.
"""

from .detect import OVERRIDE_ENV, Detection, detect
from .registry import (
    BUILTIN_CLASSES,
    ENTRY_POINT_GROUP,
    HardwareClass,
    UnknownHardwareClassError,
    get_hardware_class,
    hardware_classes,
)

__all__ = [
    "BUILTIN_CLASSES",
    "ENTRY_POINT_GROUP",
    "OVERRIDE_ENV",
    "Detection",
    "HardwareClass",
    "UnknownHardwareClassError",
    "detect",
    "get_hardware_class",
    "hardware_classes",
]
