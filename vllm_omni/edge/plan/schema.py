"""The plan's JSON Schema and its error type: the first check any plan goes through (no torch).

The schema (``schemas/exec_plan.schema.json``) pins the shape of a plan; everything it cannot
say (files, contracts, ids) is checked by :mod:`.validation`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import EdgeError

PLAN_SCHEMA = "vllm-omni-edge/exec-plan"
PLAN_SCHEMA_VERSION = 2
SCHEMA_PATH = Path(__file__).with_name("schemas") / "exec_plan.schema.json"


class ExecPlanError(EdgeError):
    """A plan is malformed, of an unknown schema, inconsistent, or does not match the artifacts it names."""


@cache
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def check_schema(payload: Any, source: str = "plan") -> None:
    """Raise :class:`ExecPlanError` naming the first field that breaks the JSON Schema (schema id first)."""
    if not isinstance(payload, dict):
        raise ExecPlanError(f"{source}: a plan is a JSON object, found {type(payload).__name__}")
    if payload.get("schema") != PLAN_SCHEMA:
        raise ExecPlanError(f"{source}: schema: expected {PLAN_SCHEMA!r}, found {payload.get('schema')!r}")
    if payload.get("schema_version") != PLAN_SCHEMA_VERSION:
        raise ExecPlanError(
            f"{source}: schema_version: {payload.get('schema_version')!r} is not one this reader knows "
            f"({PLAN_SCHEMA_VERSION}); rebuild the plan with this version of vllm-omni-edge, or update the reader"
        )
    import jsonschema

    validator = jsonschema.Draft202012Validator(plan_schema())
    errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        raise ExecPlanError(f"{source}: {where}: {error.message}")
