r"""The plan's JSON Schema and its error type: the first check any plan goes through (no torch).

The schema (``schemas/exec_plan.schema.json``) pins the shape of a plan; everything it cannot
say (files, contracts, ids) is checked by :mod:`.validation`. The browser reads the same file
(``web/edge/plan.mjs``, served beside it by the page's routes) and must answer every plan as
:func:`check_schema` does: ``tests/data/plan_cases.json`` holds the cases both run.

JSON Schema patterns are ECMA-262 regular expressions; Python's ``re`` differs in one way the
schemas would meet: ``$`` also matches before a final newline (``"main\n"`` would pass
``^[a-z]+$``). :func:`check_schema` reads ``$`` as the end of the text, as the browser does. (The
schemas use no ``\d``, ``\w`` or ``\s``, whose reach into Unicode differs between the two as well.)
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import EdgeError

SCHEMA_DIR = Path(__file__).with_name("schemas")
SCHEMA_PATH = SCHEMA_DIR / "exec_plan.schema.json"


class ExecPlanError(EdgeError):
    """A plan is malformed, of an unknown schema, inconsistent, or does not match the artifacts it names."""


@cache
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


PLAN_SCHEMA: str = plan_schema()["properties"]["schema"]["const"]
PLAN_SCHEMA_VERSION: int = plan_schema()["properties"]["schema_version"]["const"]


def ecma_pattern(pattern: str) -> str:
    """``pattern`` (ECMA-262) for Python's ``re``: each ``$`` anchor (not escaped, not in a class) as ``\\Z``."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            char = r"\Z"
        out.append(char)
    return "".join(out)


@cache
def _validator_class() -> Any:
    import jsonschema
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]):
        if validator.is_type(instance, "string") and not re.search(ecma_pattern(pattern), instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": pattern})


def validator_for(schema: dict[str, Any]) -> Any:
    """A JSON Schema 2020-12 validator of ``schema`` (jsonschema's, its messages) whose ``pattern`` is ECMA-262's
    (see the module's note): what every plan and the step schema's own tests are checked with."""
    return _validator_class()(schema)


def check_schema(payload: Any, source: str = "plan") -> None:
    """Raise :class:`ExecPlanError` naming the first field that breaks the JSON Schema (schema id first), or a graph's
    external data file not named as the graph records it (``<graph>.data``, beside it; the browser's reader alike)."""
    if not isinstance(payload, dict):
        raise ExecPlanError(f"{source}: a plan is a JSON object, found {type(payload).__name__}")
    if payload.get("schema") != PLAN_SCHEMA:
        raise ExecPlanError(f"{source}: schema: expected {PLAN_SCHEMA!r}, found {payload.get('schema')!r}")
    if payload.get("schema_version") != PLAN_SCHEMA_VERSION:
        raise ExecPlanError(
            f"{source}: schema_version: {payload.get('schema_version')!r} is not one this reader knows "
            f"({PLAN_SCHEMA_VERSION}); rebuild the plan with this version of vllm-omni-edge, or update the reader"
        )
    validator = validator_for(plan_schema())
    errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        where = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        raise ExecPlanError(f"{source}: {where}: {error.message}")
    for role, artifact in payload["artifacts"].items():  # the name the graph records: what a runtime opens
        weights = artifact.get("external_data")
        if weights is not None and weights["file"] != f"{artifact['file']}.data":
            raise ExecPlanError(
                f"{source}: artifacts.{role}.external_data.file: expected {artifact['file'] + '.data'!r} (beside the "
                f"graph, under the name it records), found {weights['file']!r}"
            )
