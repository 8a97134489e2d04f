// The part of JSON Schema 2020-12 that the project's schemas (vllm_omni/edge/plan/schemas/) use: a verdict, and for
// a refusal the field at fault, the rule it breaks and a sentence in this page's words.
//
// The server checks plans against the same files with the jsonschema package; tests/data/plan_cases.json holds the
// documents both must accept or refuse. A keyword this reader does not implement throws SchemaKeywordError when a
// schema uses it: never a silent pass. Patterns are ECMA-262 (the `u` flag), which the server's reader uses too.

import { jsonType, shown } from "./json_text.mjs";

export class SchemaKeywordError extends Error {
  constructor(keyword) {
    super(
      `the schema uses the keyword ${JSON.stringify(keyword)}, which web/edge/json_schema.mjs does not implement: ` +
        "implement it there (tests/data/plan_cases.json holds the cases it must answer)",
    );
    this.name = "SchemaKeywordError";
  }
}

// Keywords that never fail a value (annotations, and definitions reached through $ref); then and else are read by if.
const PASSIVE = new Set(["$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples"]);
const PAIRED = new Set(["then", "else"]);

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
const TYPES = {
  object: isObject,
  array: Array.isArray,
  string: (value) => typeof value === "string",
  number: (value) => typeof value === "number",
  integer: Number.isInteger, // JSON Schema's integer: a number with no fraction, however it was written
  boolean: (value) => typeof value === "boolean",
  null: (value) => value === null,
};

/** JSON equality: arrays and objects by value. */
function equal(a, b) {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((item, i) => equal(item, b[i]));
  }
  if (isObject(a) || isObject(b)) {
    const keys = isObject(a) && isObject(b) ? Object.keys(a) : null;
    if (keys === null || keys.length !== Object.keys(b).length) return false;
    return keys.every((key) => Object.hasOwn(b, key) && equal(a[key], b[key]));
  }
  return a === b;
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

const length = (value) => (typeof value === "string" ? [...value].length : value.length);

/** Every error of `value` (at `path`) against `schema`: `{path, order, keyword, message}` (`order`: the path it
 * sorts by). */
function errors(root, schema, value, path) {
  if (schema === true) return [];
  if (schema === false) return [{ path, order: path, keyword: "false", message: "no value is allowed here" }];
  const found = [];
  // a missing or unexpected field is named by its own path, and ordered by its object's (as the schema lists it)
  const fail = (keyword, message, at = path) => found.push({ path: at, order: path, keyword, message });
  const foundValue = () => `found ${shown(value)}`;
  for (const [keyword, rule] of Object.entries(schema)) {
    if (PASSIVE.has(keyword) || PAIRED.has(keyword)) continue;
    const sized = typeof value === "string" || Array.isArray(value);
    switch (keyword) {
      case "$ref":
        found.push(...errors(root, resolve(root, rule), value, path));
        break;
      case "type": {
        const types = Array.isArray(rule) ? rule : [rule];
        if (!types.some((type) => TYPES[type](value))) {
          fail(keyword, `expected ${types.join(" or ")}, found ${jsonType(value)} ${shown(value)}`);
        }
        break;
      }
      case "const":
        if (!equal(value, rule)) fail(keyword, `expected ${shown(rule)}, ${foundValue()}`);
        break;
      case "enum":
        if (!rule.some((option) => equal(value, option))) {
          fail(keyword, `expected one of ${shown(rule, 80)}, ${foundValue()}`);
        }
        break;
      case "required":
        if (isObject(value)) {
          const missing = rule.filter((key) => !Object.hasOwn(value, key));
          for (const key of missing) fail(keyword, "missing, and this document must have it", [...path, key]);
        }
        break;
      case "properties":
        if (isObject(value)) {
          for (const [key, sub] of Object.entries(rule)) {
            if (Object.hasOwn(value, key)) found.push(...errors(root, sub, value[key], [...path, key]));
          }
        }
        break;
      case "additionalProperties":
        if (isObject(value)) {
          const extras = Object.keys(value).filter((k) => !Object.hasOwn(schema.properties ?? {}, k));
          for (const key of extras.sort()) {
            const at = [...path, key];
            if (rule === false) fail(keyword, "not a field this document may have (one of another version?)", at);
            else found.push(...errors(root, rule, value[key], at));
          }
        }
        break;
      case "minProperties":
        if (isObject(value) && Object.keys(value).length < rule) {
          fail(keyword, `needs at least ${rule} entries, ${foundValue()}`);
        }
        break;
      case "maxProperties":
        if (isObject(value) && Object.keys(value).length > rule) fail(keyword, `takes at most ${rule} entries`);
        break;
      case "prefixItems":
        if (Array.isArray(value)) {
          rule.forEach((sub, i) => i < value.length && found.push(...errors(root, sub, value[i], [...path, i])));
        }
        break;
      case "items":
        if (Array.isArray(value)) {
          for (let i = (schema.prefixItems ?? []).length; i < value.length; i++) {
            found.push(...errors(root, rule, value[i], [...path, i]));
          }
        }
        break;
      case "minItems":
      case "minLength":
        if (sized && (keyword === "minItems") === Array.isArray(value) && length(value) < rule) {
          fail(keyword, `needs at least ${rule} ${Array.isArray(value) ? "items" : "characters"}, ${foundValue()}`);
        }
        break;
      case "maxItems":
      case "maxLength":
        if (sized && (keyword === "maxItems") === Array.isArray(value) && length(value) > rule) {
          const unit = Array.isArray(value) ? "items" : "characters";
          fail(keyword, `takes at most ${rule} ${unit}, found ${length(value)}`);
        }
        break;
      case "pattern":
        if (typeof value === "string" && !regex(rule).test(value)) {
          fail(keyword, `${foundValue()}, which does not match ${rule}`);
        }
        break;
      case "minimum":
        if (typeof value === "number" && value < rule) fail(keyword, `must be at least ${rule}, ${foundValue()}`);
        break;
      case "maximum":
        if (typeof value === "number" && value > rule) fail(keyword, `must be at most ${rule}, ${foundValue()}`);
        break;
      case "allOf":
        for (const sub of rule) found.push(...errors(root, sub, value, path));
        break;
      case "not":
        if (errors(root, rule, value, path).length === 0) {
          const what = rule.pattern ? `matches ${rule.pattern}` : `is ${shown(rule, 80)}`;
          fail(keyword, `${foundValue()}, which ${what}: a form this field must not have`);
        }
        break;
      case "if": {
        const branch = errors(root, rule, value, path).length === 0 ? schema.then : schema.else;
        if (branch !== undefined) found.push(...errors(root, branch, value, path));
        break;
      }
      default:
        throw new SchemaKeywordError(keyword);
    }
  }
  return found;
}

/** Paths compared field by field (a shorter path, the whole, before its parts), so the first error is stable. */
function comparePaths(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a[i] !== b[i]) return String(a[i]) < String(b[i]) ? -1 : 1;
  }
  return a.length - b.length;
}

/**
 * The first error of `value` against `schema` by field path (of two at one path, the schema's first), as
 * `{field, keyword, message}` (`field`: the path joined with dots, "" for the whole document), or null when it is
 * valid.
 */
export function firstSchemaError(schema, value) {
  const found = errors(schema, schema, value, []);
  if (!found.length) return null;
  const [first] = found
    .map((error, index) => ({ ...error, index }))
    .sort((a, b) => comparePaths(a.order, b.order) || a.index - b.index);
  return { field: first.path.join("."), keyword: first.keyword, message: first.message };
}
