// JSON read the way Python's json.loads reads it, and values written the way Python's repr() writes them.
//
// The codec stream's Python parser decides "is this field an int" with isinstance(value, int): `16.0`
// is a float there and refused, while JavaScript's JSON.parse makes it the number 16. To refuse exactly
// what Python refuses, this reader keeps that distinction: every object or array that holds a value
// written as a float (a fraction or an exponent, NaN, Infinity) carries the set of those keys/indexes
// under the non-enumerable symbol FLOATS. It also accepts NaN/Infinity/-Infinity, as Python does.
// The repr helpers let error messages match the Python parser's text.

export const FLOATS = Symbol("python-json-floats");
const MAX_DEPTH = 1000; // Python's default recursion limit: deeper documents are a RecursionError there

class JSONDecodeError extends Error {
  constructor(message, position) {
    super(`${message} at ${position}`);
    this.name = "JSONDecodeError";
  }
}

const WHITESPACE = new Set([" ", "\t", "\n", "\r"]);
const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/y;
const ESCAPES = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
const HEX4 = /^[0-9a-fA-F]{4}$/;

function markFloat(container, key) {
  if (!container[FLOATS]) Object.defineProperty(container, FLOATS, { value: new Set(), enumerable: false });
  container[FLOATS].add(key);
}

/** `{value, isFloat}`: `text` parsed as Python's json.loads would; throws JSONDecodeError / RecursionError. */
export function parsePythonJson(text) {
  let at = 0;
  const skip = () => {
    while (at < text.length && WHITESPACE.has(text[at])) at++;
  };

  function string() {
    at++; // opening quote
    let out = "";
    let chunk = at;
    for (;;) {
      if (at >= text.length) throw new JSONDecodeError("Unterminated string", chunk);
      const c = text.charCodeAt(at);
      if (c === 0x22) {
        out += text.slice(chunk, at);
        at++;
        return out;
      }
      if (c < 0x20) throw new JSONDecodeError("Invalid control character", at);
      if (c !== 0x5c) {
        at++;
        continue;
      }
      out += text.slice(chunk, at);
      const e = text[at + 1];
      if (e === "u") {
        const hex = text.slice(at + 2, at + 6);
        if (!HEX4.test(hex)) throw new JSONDecodeError("Invalid \\uXXXX escape", at);
        out += String.fromCharCode(parseInt(hex, 16));
        at += 6;
      } else if (e !== undefined && Object.hasOwn(ESCAPES, e)) {
        out += ESCAPES[e];
        at += 2;
      } else {
        throw new JSONDecodeError("Invalid \\escape", at);
      }
      chunk = at;
    }
  }

  // value() returns [value, isFloat]
  function value(depth) {
    if (depth > MAX_DEPTH) {
      const error = new Error("maximum recursion depth exceeded while decoding a JSON document");
      error.name = "RecursionError";
      throw error;
    }
    const c = text[at];
    if (c === '"') return [string(), false];
    if (c === "{") {
      at++;
      const object = {};
      skip();
      if (text[at] === "}") {
        at++;
        return [object, false];
      }
      for (;;) {
        if (text[at] !== '"') throw new JSONDecodeError("Expecting property name enclosed in double quotes", at);
        const key = string();
        skip();
        if (text[at] !== ":") throw new JSONDecodeError("Expecting ':' delimiter", at);
        at++;
        skip();
        const [item, isFloat] = value(depth + 1);
        Object.defineProperty(object, key, { value: item, enumerable: true, writable: true, configurable: true });
        if (isFloat) markFloat(object, key);
        else object[FLOATS]?.delete(key); // a later duplicate key wins, as in a Python dict
        skip();
        if (text[at] === "}") {
          at++;
          return [object, false];
        }
        if (text[at] !== ",") throw new JSONDecodeError("Expecting ',' delimiter", at);
        at++;
        skip();
      }
    }
    if (c === "[") {
      at++;
      const array = [];
      skip();
      if (text[at] === "]") {
        at++;
        return [array, false];
      }
      for (;;) {
        const [item, isFloat] = value(depth + 1);
        if (isFloat) markFloat(array, array.length);
        array.push(item);
        skip();
        if (text[at] === "]") {
          at++;
          return [array, false];
        }
        if (text[at] !== ",") throw new JSONDecodeError("Expecting ',' delimiter", at);
        at++;
        skip();
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
    throw new JSONDecodeError("Expecting value", at);
  }

  skip();
  const [parsed, isFloat] = value(0);
  skip();
  if (at !== text.length) throw new JSONDecodeError("Extra data", at);
  return { value: parsed, isFloat };
}

const WORDS = [
  ["null", null, false],
  ["true", true, false],
  ["false", false, false],
  ["NaN", NaN, true],
  ["Infinity", Infinity, true],
  ["-Infinity", -Infinity, true],
];

// -- Python's repr --------------------------------------------------------------------------------------

/** str(float) / repr(float) in Python: `12.5`, `0.0`, `1e-05`, `1e+16`, `nan`, `inf`. */
export function pyFloatStr(x) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  const [mantissa, exponentText] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const exponent = Number(exponentText);
  if (exponent < -4 || exponent >= 16) {
    const rest = digits.length > 1 ? `.${digits.slice(1)}` : "";
    const power = String(Math.abs(exponent)).padStart(2, "0");
    return `${sign}${digits[0]}${rest}e${exponent < 0 ? "-" : "+"}${power}`;
  }
  if (exponent < 0) return `${sign}0.${"0".repeat(-exponent - 1)}${digits}`;
  const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, "0");
  const fraction = digits.slice(exponent + 1);
  return `${sign}${whole}.${fraction || "0"}`;
}

function isPrintable(code) {
  if (code < 0x20 || code === 0x7f) return false;
  if (code >= 0x80 && code <= 0xa0) return false;
  if (code === 0xad || code === 0x2028 || code === 0x2029) return false;
  if (code >= 0xd800 && code <= 0xdfff) return false; // a lone surrogate
  return true;
}

/** repr(str) in Python. */
export function pyStrRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const char of text) {
    const code = char.codePointAt(0);
    if (char === "\\" || char === quote) out += `\\${char}`;
    else if (char === "\t") out += "\\t";
    else if (char === "\n") out += "\\n";
    else if (char === "\r") out += "\\r";
    else if (isPrintable(code)) out += char;
    else if (code < 0x100) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else if (code < 0x10000) out += `\\u${code.toString(16).padStart(4, "0")}`;
    else out += `\\U${code.toString(16).padStart(8, "0")}`;
  }
  return out + quote;
}

/** repr(bytes) in Python: `b'QCS\x01'`. */
export function pyBytesRepr(bytes) {
  const values = Array.from(bytes);
  const hasSingle = values.includes(0x27);
  const quote = hasSingle && !values.includes(0x22) ? '"' : "'";
  let out = `b${quote}`;
  for (const byte of values) {
    const char = String.fromCharCode(byte);
    if (char === "\\" || char === quote) out += `\\${char}`;
    else if (byte === 0x09) out += "\\t";
    else if (byte === 0x0a) out += "\\n";
    else if (byte === 0x0d) out += "\\r";
    else if (byte < 0x20 || byte >= 0x7f) out += `\\x${byte.toString(16).padStart(2, "0")}`;
    else out += char;
  }
  return out + quote;
}

/** repr() of a value parsed by parsePythonJson (`isFloat`: it was written as a float). */
export function pyRepr(value, isFloat = false) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") {
    if (isFloat || !Number.isFinite(value)) return pyFloatStr(value);
    return Number.isSafeInteger(value) ? String(value) : BigInt(value).toString();
  }
  if (typeof value === "string") return pyStrRepr(value);
  const floats = value[FLOATS];
  if (Array.isArray(value)) return `[${value.map((item, i) => pyRepr(item, floats?.has(i))).join(", ")}]`;
  const items = Object.entries(value).map(([key, item]) => `${pyStrRepr(key)}: ${pyRepr(item, floats?.has(key))}`);
  return `{${items.join(", ")}}`;
}

/** type(x).__name__ in Python for a value parsePythonJson read (`isFloat`: it was written as a float). */
export function pyTypeName(value, isFloat = false) {
  if (value === null || value === undefined) return "NoneType";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "number") return isFloat || !Number.isInteger(value) ? "float" : "int";
  if (typeof value === "string") return "str";
  return Array.isArray(value) ? "list" : "dict";
}
