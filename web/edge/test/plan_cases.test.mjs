// The shared table of plans and step contracts (tests/data/plan_cases.json), answered by the browser's readers.
//
// tests/edge/plan/test_plan_cases.py runs the same table through the Python readers, checking their messages. Here
// each case must get its verdict, and a refusal its reader's error class naming the case's `field`, with a message
// of the page's own that names that field too. Needs no fixtures: the table is data.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { SchemaKeywordError, firstSchemaError } from "../json_schema.mjs";
import { readJson, writtenAsFloat } from "../json_text.mjs";
import { copyJson, setJson } from "../testing/json_copy.mjs";
import { PlanError, checkPlanSchema, planFiles } from "../plan.mjs";
import stepSchema from "../schemas/step_contract.schema.json" with { type: "json" };
import { StepContractError, checkStepContract } from "../stateful_decoder.mjs";

const TABLE_URL = new URL("../../../tests/data/plan_cases.json", import.meta.url);
const TABLE = readJson(readFileSync(TABLE_URL, "utf8"));

/** `document` with the RFC 6902 `patch` applied (ops add, replace, remove), as the Python test applies it. */
function patched(document, patch) {
  let result = copyJson(document);
  for (const op of patch) {
    const unescape = (key) => key.replaceAll("~1", "/").replaceAll("~0", "~");
    const keys = op.path === "" ? [] : op.path.split("/").slice(1).map(unescape);
    const value = copyJson(op.value);
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
      setJson(parent, last, value, writtenAsFloat(op, "value"));
    } else {
      throw new Error(`patch op ${op.op} is not one the table uses (add, replace, remove)`);
    }
  }
  return result;
}

/** null when `check` accepts `document`, else its error (an error of another type fails the test). */
function refusal(check, document, ErrorType) {
  try {
    check(document);
  } catch (error) {
    assert.ok(error instanceof ErrorType, `${error.name}: ${error.message}`);
    return error;
  }
  return null;
}

function expect(error, testCase) {
  if (testCase.valid) {
    assert.equal(error, null, `refused: ${error?.message}`);
    return;
  }
  assert.notEqual(error, null, "accepted");
  assert.equal(error.field, testCase.field, `the field at fault (${error.message})`);
  const named = testCase.field.split(".").at(-1);
  assert.ok(error.message.includes(named), `the message names ${named}: ${error.message}`);
}

test("the bases are accepted whole: the plan with its step contracts, the contract by the step schema", () => {
  assert.equal(planFiles(copyJson(TABLE.plan)).length, 2);
  assert.equal(firstSchemaError(stepSchema, copyJson(TABLE.step_contract)), null);
  assert.ok(TABLE.plan_cases.length >= 40 && TABLE.step_contract_cases.length >= 35);
  for (const testCase of [...TABLE.plan_cases, ...TABLE.step_contract_cases]) {
    assert.equal(typeof testCase.field, testCase.valid ? "undefined" : "string", `${testCase.name}: its field`);
  }
});

for (const testCase of TABLE.plan_cases) {
  test(`plan: ${testCase.name}`, () => {
    expect(refusal(checkPlanSchema, patched(TABLE.plan, testCase.patch), PlanError), testCase);
  });
}

for (const testCase of TABLE.step_contract_cases) {
  test(`step contract: ${testCase.name}`, () => {
    const contract = patched(TABLE.step_contract, testCase.patch);
    expect(refusal((row) => checkStepContract(row, "contract"), contract, StepContractError), testCase);
    if (testCase.valid) assert.equal(firstSchemaError(stepSchema, contract), null, "the step schema refuses it");
  });
}

test("readJson keeps which numbers were written as floats, reads NaN and Infinity, refuses what is not JSON", () => {
  const document = readJson('{"a": 4.0, "b": 4, "c": [1e2, 100], "d": NaN, "e": -Infinity}');
  assert.deepEqual([writtenAsFloat(document, "a"), writtenAsFloat(document, "b")], [true, false]);
  assert.deepEqual([writtenAsFloat(document.c, 0), writtenAsFloat(document.c, 1)], [true, false]);
  assert.ok(Number.isNaN(document.d) && document.e === -Infinity && writtenAsFloat(document, "d"));
  assert.equal(writtenAsFloat(readJson('{"a": 4.0, "a": 4}'), "a"), false, "a later duplicate key wins, with its form");
  const deep = "[".repeat(1002) + "]".repeat(1002);
  for (const broken of ["{'a': 1}", '{"a": 1} x', '"a\u0001"', "[1,]", "01", "nan", deep]) {
    assert.throws(() => readJson(broken), { name: "JsonTextError" }, broken.slice(0, 20));
  }
});

test("a plan's step contract is checked before any file is fetched, its fault named by role and field", () => {
  const plan = patched(TABLE.plan, [{ op: "add", path: "/artifacts/first/contract/max_step_frames", value: 4097 }]);
  assert.throws(() => planFiles(plan, "the browser plan"), (error) => {
    assert.ok(error instanceof PlanError);
    assert.equal(error.field, "artifacts.first.contract.max_step_frames");
    assert.ok(error.message.startsWith("the browser plan: artifacts.first.contract.max_step_frames: "), error.message);
    assert.ok(error.message.includes("1..4096") && error.message.includes("4097"), error.message);
    return true;
  });
});

test("a schema keyword this reader does not implement is an error, never a pass", () => {
  const unknown = { type: "object", patternProperties: { "^x": false } };
  assert.throws(() => firstSchemaError(unknown, { x: 1 }), SchemaKeywordError);
  assert.throws(() => firstSchemaError({ $ref: "other.json#/a" }, 1), SchemaKeywordError);
  assert.deepStrictEqual(firstSchemaError({ properties: { a: { minimum: 2 } } }, { a: 1 }), {
    field: "a",
    keyword: "minimum",
    message: "must be at least 2, found 1",
  });
});
