"""The hardware-class registry and ``detect()``: what each class of device decodes with (data only).

A class names its builder as a ``module:function`` string in :mod:`vllm_omni.edge.builders`.
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
