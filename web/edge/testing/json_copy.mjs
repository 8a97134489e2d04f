// Test helpers over json_text.mjs's values (the shared cases patch documents): copies and sets that keep the marks
// of numbers written as floats. The page never patches a document, so these live with the tests.

import { markFloat, writtenAsFloat } from "../json_text.mjs";

/** A deep copy that keeps the float marks (structuredClone drops them). */
export function copyJson(value) {
  if (value === null || typeof value !== "object") return value;
  const copy = Array.isArray(value) ? [] : {};
  for (const [key, item] of Object.entries(value)) {
    const index = Array.isArray(value) ? Number(key) : key;
    copy[index] = copyJson(item);
    markFloat(copy, index, writtenAsFloat(value, index));
  }
  return copy;
}

/** Set `container[key] = item`, written as a float or not (a patch that replaces a value replaces its form). */
export function setJson(container, key, item, isFloat) {
  container[key] = item;
  markFloat(container, key, isFloat);
}
