"""Execution plans: the one source of truth on what a device decodes with (no torch).

:mod:`.model` is the plan itself, :mod:`.schema` and :mod:`.validation` check it, :mod:`.construct`
makes one from what a build produced, :mod:`.manifest` is the windowed programs' own description.
"""

from .artifact import PlanArtifact
from .construct import StepArtifact, file_record, stateful_plan, windowed_plan
from .manifest import MANIFEST_NAME, ManifestError, ProgramEntry, WindowedManifest
from .model import DEFAULT_DEVICE_DIR, PLAN_NAME, ExecPlan, session_option
from .schema import PLAN_SCHEMA, PLAN_SCHEMA_VERSION, ExecPlanError, check_schema

__all__ = [
    "DEFAULT_DEVICE_DIR",
    "MANIFEST_NAME",
    "PLAN_NAME",
    "PLAN_SCHEMA",
    "PLAN_SCHEMA_VERSION",
    "ExecPlan",
    "ExecPlanError",
    "ManifestError",
    "PlanArtifact",
    "ProgramEntry",
    "StepArtifact",
    "WindowedManifest",
    "check_schema",
    "file_record",
    "session_option",
    "stateful_plan",
    "windowed_plan",
]
