"""The hardware-class registry: which artifacts and runtime each class of device decodes with."""

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
