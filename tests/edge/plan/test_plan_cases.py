"""The shared table of plans and step contracts (tests/data/plan_cases.json), answered by the Python readers.

web/edge/test/plan_cases.test.mjs runs the same table through the browser's readers; both must give each case its
verdict and, for a refusal, a message that holds the case's ``error``. The bases are real: the base plan loads
through :meth:`ExecPlan.from_json` (plan_id, contracts and all), so a case fails for its own fault only.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from vllm_omni.edge.graphs.step_contract import STEP_SCHEMA, StepContract, StepContractError
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.edge.plan.schema import SCHEMA_DIR, check_schema, ecma_pattern, validator_for

TABLE_PATH = Path(__file__).resolve().parents[2] / "data" / "plan_cases.json"
TABLE = json.loads(TABLE_PATH.read_text())


def pointer(path: str) -> list[str]:
    """An RFC 6901 JSON Pointer as its keys (``""`` is the whole document)."""
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]] if path else []


def patched(document: Any, patch: list[dict[str, Any]]) -> Any:
    """``document`` with the RFC 6902 ``patch`` applied (ops add, replace, remove), as the JS test applies it."""
    document = copy.deepcopy(document)
    for op in patch:
        keys = pointer(op["path"])
        if not keys:
            document = copy.deepcopy(op["value"])
            continue
        parent = document
        for key in keys[:-1]:
            parent = parent[int(key)] if isinstance(parent, list) else parent[key]
        last = int(keys[-1]) if isinstance(parent, list) else keys[-1]
        if op["op"] == "remove":
            del parent[last]
        elif op["op"] == "add" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(op["value"]))
        elif op["op"] in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"patch op {op['op']!r} is not one the table uses (add, replace, remove)")
    return document


def verdict(check, document: Any, errors: tuple[type[Exception], ...]) -> str | None:
    """None when ``check`` accepts ``document``, else its message."""
    try:
        check(document)
    except errors as exc:
        return str(exc)
    return None


def test_the_bases_are_whole_valid_documents():
    plan = ExecPlan.from_json(TABLE["plan"])  # schema, plan_id, speech_decoder, contracts against the geometry
    assert plan.step_contract("main").to_json() == TABLE["step_contract"]
    assert len(TABLE["plan_cases"]) >= 40 and len(TABLE["step_contract_cases"]) >= 35
    names = [case["name"] for case in TABLE["plan_cases"] + TABLE["step_contract_cases"]]
    assert len(names) == len(set(names)), "case names are how a failure is reported: keep them unique"


@pytest.mark.parametrize("case", TABLE["plan_cases"], ids=lambda case: case["name"])
def test_each_plan_case_is_answered_by_the_plan_schema(case):
    message = verdict(check_schema, patched(TABLE["plan"], case["patch"]), (ExecPlanError,))
    if case["valid"]:
        assert message is None, message
    else:
        assert message is not None, "accepted"
        assert case["error"] in message, message


@pytest.mark.parametrize("case", TABLE["step_contract_cases"], ids=lambda case: case["name"])
def test_each_step_contract_case_is_answered_by_the_step_contract_reader(case):
    contract = patched(TABLE["step_contract"], case["patch"])
    message = verdict(lambda row: StepContract.from_json(row, source="contract"), contract, (StepContractError,))
    if case["valid"]:
        assert message is None, message
    else:
        assert message is not None, "accepted"
        assert case["error"] in message, message


@pytest.mark.parametrize(
    "case", [case for case in TABLE["step_contract_cases"] if case["valid"]], ids=lambda case: case["name"]
)
def test_the_step_schema_accepts_every_contract_the_readers_accept(case):
    """The schema is a document of what the readers take, not a second rule: it never refuses what they accept."""
    contract = patched(TABLE["step_contract"], case["patch"])
    errors = [error.message for error in validator_for(STEP_SCHEMA).iter_errors(contract)]
    assert errors == []


def test_the_schemas_are_valid_json_schemas_that_name_their_readers():
    paths = sorted(SCHEMA_DIR.glob("*.schema.json"))
    assert [path.name for path in paths] == ["exec_plan.schema.json", "step_contract.schema.json"]
    for path in paths:
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))  # SchemaError when malformed
    assert "web/edge/stateful_decoder.mjs" in STEP_SCHEMA["description"]
    assert "tests/data/plan_cases.json" in STEP_SCHEMA["description"]


@pytest.mark.parametrize(
    ("pattern", "text", "python_re", "ecma"),
    [
        ("^[0-9a-f]{2}$", "ab\n", True, False),  # Python's $ also matches before a final newline
        ("(/|$)", "a", True, True),
        ("[$]", "$", True, True),  # in a class, $ is a character
        ("\\$", "$", True, True),  # escaped, too
    ],
)
def test_a_dollar_anchor_is_the_end_of_the_text_as_in_ecma_262(pattern, text, python_re, ecma):
    assert bool(re.search(pattern, text)) is python_re
    assert bool(re.search(ecma_pattern(pattern), text)) is ecma
