"""What a build is asked for: the checkpoint, the output directory, and sizes that override the class defaults."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgeExportError
from ..files import directory_problem, json_schema_of
from ..hardware.registry import HardwareClass
from ..plan.manifest import MANIFEST_NAME, MANIFEST_SCHEMA
from ..plan.model import DEFAULT_DEVICE_DIR, PLAN_NAME
from ..plan.schema import PLAN_SCHEMA

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildRequest:
    """What to build; ``None`` sizes take the hardware class's defaults."""

    model: str
    out_dir: Path
    target: str | None = None
    graph: str | None = None  # "windowed" | "stateful"; None: the class's default graph kind
    ramp: tuple[int, ...] | None = None
    context_frames: int | None = None
    partitioner: str | None = None
    step_frames: int | None = None
    first_step_frames: int | None = None  # 0: no first step
    # NPU classes: one graph (and one compiled file, one copy of the weights) for the first and main
    # step sizes instead of one per size; None: the class's default (``one_step_graph``)
    one_step_graph: bool | None = None
    device_dir: str = DEFAULT_DEVICE_DIR
    check: bool = True
    force: bool = False  # replace an exec_plan.json / manifest.json in out_dir that this tool did not write
    progress: Callable[[str], None] = field(default=logger.info, compare=False)


def class_default(value: Any, hardware_class: HardwareClass, key: str) -> Any:
    """``value``, or the hardware class's default for ``key`` when ``value`` is ``None``."""
    return hardware_class.defaults.get(key) if value is None else value


class BuildArgumentError(EdgeExportError, ValueError):
    """A build request that cannot work as given (checked before any work): the command line's exit code 2."""


# The files a build writes by name into its output directory, and the schema that marks them as its own.
OWN_FILES = {PLAN_NAME: PLAN_SCHEMA, MANIFEST_NAME: MANIFEST_SCHEMA}


def check_out_dir(out_dir: str | Path, force: bool = False) -> None:
    """Raise :class:`BuildArgumentError` unless a build may write into ``out_dir``.

    ``out_dir`` must be a writable directory, or one that can be created (not under a file); an
    ``exec_plan.json`` or ``manifest.json`` already in it must be one this tool wrote (its ``schema``),
    or ``force`` must be set: a build never replaces someone else's file of the same name.
    """
    out_dir = Path(out_dir)
    problem = directory_problem(out_dir)
    if problem:
        raise BuildArgumentError(
            f"cannot write the output directory {out_dir}: {problem}; a build writes a directory (artifacts + "
            f"{PLAN_NAME}): name another one"
        )
    if force:
        return
    for name, schema in OWN_FILES.items():
        path = out_dir / name
        if (path.exists() or path.is_symlink()) and json_schema_of(path) != schema:
            raise BuildArgumentError(
                f"{path} exists and is not a {schema} file this tool wrote; it would be replaced: move it, choose "
                "another output directory, or pass --force"
            )
