"""What a build is asked for: the checkpoint, the output directory, and sizes that override the class defaults."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hardware.registry import HardwareClass
from ..plan.model import DEFAULT_DEVICE_DIR

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    """What to build; ``None`` sizes take the hardware class's defaults."""

    model: str
    out_dir: Path
    target: str | None = None
    ramp: tuple[int, ...] | None = None
    context_frames: int | None = None
    partitioner: str | None = None
    step_frames: int | None = None
    first_step_frames: int | None = None  # 0: no first step
    device_dir: str = DEFAULT_DEVICE_DIR
    check: bool = True
    progress: Callable[[str], None] = field(default=logger.info, compare=False)


def class_default(value: Any, hardware_class: HardwareClass, key: str) -> Any:
    """``value``, or the hardware class's default for ``key`` when ``value`` is ``None``."""
    return hardware_class.defaults.get(key) if value is None else value
