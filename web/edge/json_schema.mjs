// The part of JSON Schema 2020-12 that the project's schemas (vllm_omni/edge/plan/schemas/) use, answering as the
// server's Python reader (jsonschema, through vllm_omni/edge/plan/schema.py) answers: the same verdict and, for the
// first error, the same text.
//
// Values are those parsePythonJson (./pyjson.mjs) reads, so an error quotes a value as Python's repr() writes it
// (`'a'`, `None`, `16.0`). Errors are collected in jsonschema's order and the first by instance path is reported,
// as schema.py does. A keyword this reader does not implement throws SchemaKeywordError when a schema uses it:
// never a silent pass. Patterns are ECMA-262 (the `u` flag), which schema.py gives Python's side as well.

import { FLOATS, pyRepr } from "./pyjson.mjs";

export class SchemaKeywordError extends Error {
  constructor(keyword) {
    super(
      `the schema uses the keyword ${JSON.stringify(keyword)}, which web/edge/json_schema.mjs does not implement: ` +
        "implement it there (and keep tests/data/plan_cases.json answered the same by Python and JavaScript)",
    );
    this.name = "SchemaKeywordError";
  }
}

// Keywords that never fail a value (annotations, and definitions reached through $ref).
const ANNOTATIONS = new Set(["$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"]);
// Keywords read by another one: then and else, by if.
const PAIRED = new Set(["then", "else"]);

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

const TYPES = {
  object: isObject,
  array: Array.isArray,
  string: (value) => typeof value === "string",
  number: (value) => typeof value === "number",
  // jsonschema's integer: an int, or a float with no fraction (16.0); never a bool
  integer: (value) => typeof value === "number" && Number.isInteger(value),
  boolean: (value) => typeof value === "boolean",
  null: (value) => value === null,
};

/** jsonschema's equality: 1 == 1.0, true != 1, lists and objects compared by value. */
function equal(a, b) {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((item, i) => equal(item, b[i]));
  }
  if (isObject(a) || isObject(b)) {
    if (!isObject(a) || !isObject(b)) return false;
    const keys = Object.keys(a);
    return keys.length === Object.keys(b).length && keys.every((key) => Object.hasOwn(b, key) && equal(a[key], b[key]));
  }
  return a === b;
}

// jsonschema's words for a length below a minimum and above a maximum (of a string's characters or a list's items).
const tooFew = (least) => (least === 1 ? "should be non-empty" : "is too short");
const tooMany = (most) => (most === 0 ? "is expected to be empty" : "is too long");

/** Python's ordering of two instance paths (lists of str and int), as `sorted(key=list(path))`. */
function comparePaths(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i] === b[i]) continue;
    return a[i] < b[i] ? -1 : 1;
  }
  return a.length - b.length;
}

const patterns = new Map();
function regex(pattern) {
  if (!patterns.has(pattern)) patterns.set(pattern, new RegExp(pattern, "u"));
  return patterns.get(pattern);
}

function resolve(root, ref) {
  if (!ref.startsWith("#/")) throw new SchemaKeywordError(`$ref ${ref} (only local references are implemented)`);
  return ref
    .slice(2)
    .split("/")
    .reduce((node, part) => node?.[part.replaceAll("~1", "/").replaceAll("~0", "~")], root);
}

class Validator {
  constructor(root) {
    this.root = root;
  }

  /** Every error of `value` (at `path`) against `schema`, each `{path, message}`, in jsonschema's order. */
  errors(schema, value, isFloat, path) {
    if (schema === true) return [];
    if (schema === false) return [{ path, message: `False schema does not allow ${pyRepr(value, isFloat)}` }];
    const found = [];
    const child = (sub, container, key) =>
      this.errors(sub, container[key], Boolean(container[FLOATS]?.has(key)), [...path, key]);
    const fail = (message) => found.push({ path, message });
    const repr = () => pyRepr(value, isFloat);
    for (const [keyword, rule] of Object.entries(schema)) {
      if (ANNOTATIONS.has(keyword) || PAIRED.has(keyword)) continue;
      switch (keyword) {
        case "$ref":
          found.push(...this.errors(resolve(this.root, rule), value, isFloat, path));
          break;
        case "type": {
          const types = Array.isArray(rule) ? rule : [rule];
          if (!types.some((type) => TYPES[type](value))) {
            fail(`${repr()} is not of type ${types.map((type) => pyRepr(type)).join(", ")}`);
          }
          break;
        }
        case "const":
          if (!equal(value, rule)) fail(`${pyRepr(rule)} was expected`);
          break;
        case "enum":
          if (!rule.some((option) => equal(value, option))) fail(`${repr()} is not one of ${pyRepr(rule)}`);
          break;
        case "required":
          if (isObject(value)) {
            for (const key of rule) if (!Object.hasOwn(value, key)) fail(`${pyRepr(key)} is a required property`);
          }
          break;
        case "properties":
          if (isObject(value)) {
            for (const [key, sub] of Object.entries(rule)) {
              if (Object.hasOwn(value, key)) found.push(...child(sub, value, key));
            }
          }
          break;
        case "additionalProperties":
          if (isObject(value)) {
            const extras = Object.keys(value)
              .filter((key) => !Object.hasOwn(schema.properties ?? {}, key))
              .sort();
            if (rule === false && extras.length) {
              const verb = extras.length === 1 ? "was" : "were";
              const names = extras.map((key) => pyRepr(key)).join(", ");
              fail(`Additional properties are not allowed (${names} ${verb} unexpected)`);
            } else if (rule !== false) {
              for (const key of extras) found.push(...child(rule, value, key));
            }
          }
          break;
        case "minProperties":
          if (isObject(value) && Object.keys(value).length < rule) {
            fail(`${repr()} ${rule === 1 ? "should be non-empty" : "does not have enough properties"}`);
          }
          break;
        case "maxProperties":
          if (isObject(value) && Object.keys(value).length > rule) {
            fail(`${repr()} ${rule === 0 ? "is expected to be empty" : "has too many properties"}`);
          }
          break;
        case "prefixItems":
          if (Array.isArray(value)) {
            rule.forEach((sub, index) => {
              if (index < value.length) found.push(...child(sub, value, index));
            });
          }
          break;
        case "items":
          if (Array.isArray(value)) {
            for (let index = (schema.prefixItems ?? []).length; index < value.length; index++) {
              found.push(...child(rule, value, index));
            }
          }
          break;
        case "minItems":
          if (Array.isArray(value) && value.length < rule) fail(`${repr()} ${tooFew(rule)}`);
          break;
        case "maxItems":
          if (Array.isArray(value) && value.length > rule) fail(`${repr()} ${tooMany(rule)}`);
          break;
        case "minLength":
          if (typeof value === "string" && [...value].length < rule) fail(`${repr()} ${tooFew(rule)}`);
          break;
        case "maxLength":
          if (typeof value === "string" && [...value].length > rule) fail(`${repr()} ${tooMany(rule)}`);
          break;
        case "pattern":
          if (typeof value === "string" && !regex(rule).test(value)) fail(`${repr()} does not match ${pyRepr(rule)}`);
          break;
        case "minimum":
          if (typeof value === "number" && value < rule) fail(`${repr()} is less than the minimum of ${pyRepr(rule)}`);
          break;
        case "maximum":
          if (typeof value === "number" && value > rule) {
            fail(`${repr()} is greater than the maximum of ${pyRepr(rule)}`);
          }
          break;
        case "allOf":
          for (const sub of rule) found.push(...this.errors(sub, value, isFloat, path));
          break;
        case "not":
          if (this.errors(rule, value, isFloat, path).length === 0) {
            fail(`${repr()} should not be valid under ${pyRepr(rule)}`);
          }
          break;
        case "if": {
          const branch = this.errors(rule, value, isFloat, path).length === 0 ? schema.then : schema.else;
          if (branch !== undefined) found.push(...this.errors(branch, value, isFloat, path));
          break;
        }
        default:
          throw new SchemaKeywordError(keyword);
      }
    }
    return found;
  }
}

/**
 * The first error of `value` against `schema` as `{where, message}` (`where`: the instance path joined with dots,
 * "(top level)" for the root), or null when it is valid. `value` comes from parsePythonJson (or JSON.parse: then
 * a float with no fraction reads as an int).
 */
export function firstSchemaError(schema, value) {
  const errors = new Validator(schema).errors(schema, value, false, []);
  if (!errors.length) return null;
  const [first] = errors
    .map((error, order) => ({ ...error, order }))
    .sort((a, b) => comparePaths(a.path, b.path) || a.order - b.order);
  return { where: first.path.join(".") || "(top level)", message: first.message };
}
