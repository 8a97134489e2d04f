// JSON as the server writes it, read keeping the one thing JSON.parse drops that the readers' verdicts need.
//
// The server writes JSON with Python's json module: an int as `16`, a float as `16.0`, and the non-finite floats
// as NaN, Infinity and -Infinity. A count (a step size, a frame total) written `16.0` is refused by the server's
// readers, and the page must refuse the same documents; JSON.parse makes `16.0` the number 16 and throws on NaN.
// readJson keeps, for every object and array, the keys (or indexes) of the numbers written with a fraction or an
// exponent (writtenAsFloat), and reads the three non-finite words. Everything else is standard JSON.

const FLOAT_KEYS = Symbol("float-keys");
const MAX_DEPTH = 1000; // deeper documents are refused: no reader of ours needs them, and recursion is bounded

export class JsonTextError extends Error {
  constructor(message, at) {
    super(`${message} (at character ${at})`);
    this.name = "JsonTextError";
  }
}

/** Whether `container[key]` was written as a float (`16.0`, `1e3`, NaN, Infinity) in the text it was read from. */
export const writtenAsFloat = (container, key) => Boolean(container?.[FLOAT_KEYS]?.has(key));

/** A number that is an integer and was written as one: what a count must be (`true` and `16.0` are not). */
export const isWrittenInteger = (container, key) =>
  Number.isInteger(container?.[key]) && !writtenAsFloat(container, key);

/** Record whether `container[key]` was written as a float (what readJson marks; a later write replaces the mark). */
export function markFloat(container, key, isFloat) {
  if (isFloat && !container[FLOAT_KEYS]) Object.defineProperty(container, FLOAT_KEYS, { value: new Set() });
  if (isFloat) container[FLOAT_KEYS].add(key);
  else container[FLOAT_KEYS]?.delete(key); // a later duplicate key wins, with its own form
}

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/y;
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;
const SPACE = /[ \t\n\r]*/y;
const WORDS = [
  ["true", true, false],
  ["false", false, false],
  ["null", null, false],
  ["NaN", NaN, true],
  ["Infinity", Infinity, true],
  ["-Infinity", -Infinity, true],
];

/** The value `text` holds; throws JsonTextError saying where the text stops being JSON. */
export function readJson(text) {
  let at = 0;
  const skip = () => {
    SPACE.lastIndex = at;
    SPACE.exec(text);
    at = SPACE.lastIndex;
  };
  const expect = (char) => {
    if (text[at] !== char) throw new JsonTextError(`expected ${JSON.stringify(char)}`, at);
    at++;
  };
  const string = () => {
    STRING.lastIndex = at;
    const match = STRING.exec(text);
    if (!match) throw new JsonTextError("a string that is not JSON", at);
    at = STRING.lastIndex;
    return JSON.parse(match[0]);
  };
  /** [value, writtenAsFloat] */
  function value(depth) {
    if (depth > MAX_DEPTH) throw new JsonTextError(`nested deeper than ${MAX_DEPTH} levels`, at);
    skip();
    const char = text[at];
    if (char === '"') return [string(), false];
    if (char === "{" || char === "[") {
      const isArray = char === "[";
      const container = isArray ? [] : {};
      const close = isArray ? "]" : "}";
      at++;
      skip();
      if (text[at] === close) {
        at++;
        return [container, false];
      }
      for (;;) {
        let key = container.length;
        if (!isArray) {
          skip();
          if (text[at] !== '"') throw new JsonTextError("expected a quoted key", at);
          key = string();
          skip();
          expect(":");
        }
        const [item, isFloat] = value(depth + 1);
        Object.defineProperty(container, key, { value: item, enumerable: true, writable: true, configurable: true });
        markFloat(container, key, isFloat);
        skip();
        if (text[at] === close) {
          at++;
          return [container, false];
        }
        expect(",");
      }
    }
    NUMBER.lastIndex = at;
    const number = NUMBER.exec(text);
    if (number) {
      at = NUMBER.lastIndex;
      return [Number(number[0]), Boolean(number[1] || number[2])];
    }
    for (const [word, literal, isFloat] of WORDS) {
      if (text.startsWith(word, at)) {
        at += word.length;
        return [literal, isFloat];
      }
    }
    throw new JsonTextError("expected a value", at);
  }
  const [result] = value(0);
  skip();
  if (at !== text.length) throw new JsonTextError("text after the value", at);
  return result;
}

/** A short JSON rendering of `value` for an error message (at most `length` characters). */
export function shown(value, length = 40) {
  let text;
  try {
    text = typeof value === "number" && !Number.isFinite(value) ? String(value) : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  text ??= String(value);
  return text.length > length ? `${text.slice(0, length - 3)}...` : text;
}

/** `container[key]` for an error message, as it was written: an integer-valued float keeps its point (`4.0`). */
export function shownAt(container, key, length = 40) {
  const value = container?.[key];
  const asFloat = writtenAsFloat(container, key) && Number.isInteger(value);
  return asFloat ? `${value}.0` : shown(value ?? null, length);
}

/** The JSON name of `value`'s type, for an error message. */
export function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value === "object" ? "object" : typeof value;
}
