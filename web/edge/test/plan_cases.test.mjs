// The shared table of plans and step contracts (tests/data/plan_cases.json), answered by the browser's readers.
//
// tests/edge/plan/test_plan_cases.py runs the same table through the Python readers; both must give each case its
// verdict and, for a refusal, a message that holds the case's `error`. Needs no fixtures: the table is data.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { SchemaKeywordError, firstSchemaError } from "../json_schema.mjs";
import { PlanError, checkPlanSchema, planFiles } from "../plan.mjs";
import { FLOATS, parsePythonJson } from "../pyjson.mjs";
import stepSchema from "../schemas/step_contract.schema.json" with { type: "json" };
import { StepContractError, checkStepContract } from "../stateful_decoder.mjs";

const TABLE_URL = new URL("../../../tests/data/plan_cases.json", import.meta.url);
const TABLE = parsePythonJson(readFileSync(TABLE_URL, "utf8")).value;

/** A deep copy that keeps parsePythonJson's float marks (structuredClone drops them). */
function clone(value) {
  if (value === null || typeof value !== "object") return value;
  const copy = Array.isArray(value)
    ? value.map(clone)
    : Object.fromEntries(Object.entries(value).map(([key, item]) => [key, clone(item)]));
  if (value[FLOATS]) Object.defineProperty(copy, FLOATS, { value: new Set(value[FLOATS]), enumerable: false });
  return copy;
}

function markFloat(container, key, isFloat) {
  if (!container[FLOATS]) Object.defineProperty(container, FLOATS, { value: new Set(), enumerable: false });
  if (isFloat) container[FLOATS].add(key);
  else container[FLOATS].delete(key);
}

/** `document` with the RFC 6902 `patch` applied (ops add, replace, remove), as the Python test applies it. */
function patched(document, patch) {
  let result = clone(document);
  for (const op of patch) {
    const unescape = (key) => key.replaceAll("~1", "/").replaceAll("~0", "~");
    const keys = op.path === "" ? [] : op.path.split("/").slice(1).map(unescape);
    const value = clone(op.value);
    const isFloat = Boolean(op[FLOATS]?.has("value"));
    if (!keys.length) {
      result = value;
      continue;
    }
    let parent = result;
    for (const key of keys.slice(0, -1)) parent = parent[Array.isArray(parent) ? Number(key) : key];
    const last = Array.isArray(parent) ? Number(keys.at(-1)) : keys.at(-1);
    if (op.op === "remove") {
      if (Array.isArray(parent)) parent.splice(last, 1);
      else delete parent[last];
    } else if (op.op === "add" && Array.isArray(parent)) {
      parent.splice(last, 0, value);
    } else if (op.op === "add" || op.op === "replace") {
      parent[last] = value;
      markFloat(parent, last, isFloat);
    } else {
      throw new Error(`patch op ${op.op} is not one the table uses (add, replace, remove)`);
    }
  }
  return result;
}

/** null when `check` accepts `document`, else its message (an error of another type fails the test). */
function verdict(check, document, ErrorType) {
  try {
    check(document);
  } catch (error) {
    assert.ok(error instanceof ErrorType, `${error.name}: ${error.message}`);
    return error.message;
  }
  return null;
}

function expect(message, testCase) {
  if (testCase.valid) assert.equal(message, null);
  else {
    assert.notEqual(message, null, "accepted");
    assert.ok(message.includes(testCase.error), `expected a message holding\n  ${testCase.error}\nfound\n  ${message}`);
  }
}

test("the bases are accepted whole: the plan with its step contracts, the contract by the step schema", () => {
  assert.equal(planFiles(clone(TABLE.plan)).length, 2);
  assert.equal(firstSchemaError(stepSchema, clone(TABLE.step_contract)), null);
  assert.ok(TABLE.plan_cases.length >= 40 && TABLE.step_contract_cases.length >= 35);
});

for (const testCase of TABLE.plan_cases) {
  test(`plan: ${testCase.name}`, () => {
    expect(verdict(checkPlanSchema, patched(TABLE.plan, testCase.patch), PlanError), testCase);
  });
}

for (const testCase of TABLE.step_contract_cases) {
  test(`step contract: ${testCase.name}`, () => {
    const contract = patched(TABLE.step_contract, testCase.patch);
    expect(verdict((row) => checkStepContract(row, "contract"), contract, StepContractError), testCase);
    if (testCase.valid) assert.equal(firstSchemaError(stepSchema, contract), null, "the step schema refuses it");
  });
}

test("a plan's step contract is checked before any file is fetched, its fault named by role", () => {
  const plan = patched(TABLE.plan, [{ op: "add", path: "/artifacts/first/contract/max_step_frames", value: 4097 }]);
  assert.throws(() => planFiles(plan, "the browser plan"), (error) => {
    assert.ok(error instanceof PlanError);
    const where = "the browser plan: artifacts.first.contract: plan artifact 'first': ";
    assert.ok(error.message.startsWith(`${where}max_step_frames must be an integer in 1..4096`), error.message);
    return true;
  });
});

test("a schema keyword this reader does not implement is an error, never a pass", () => {
  assert.throws(() => firstSchemaError({ type: "object", patternProperties: { "^x": false } }, { x: 1 }), SchemaKeywordError);
  assert.throws(() => firstSchemaError({ $ref: "other.json#/a" }, 1), SchemaKeywordError);
  assert.deepStrictEqual(firstSchemaError({ properties: { a: { minimum: 2 } } }, { a: 1 }), {
    where: "a",
    message: "1 is less than the minimum of 2",
  });
});
