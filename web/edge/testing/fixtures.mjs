// Where the Node tests find the fixtures tests/web/make_fixtures.py wrote (EDGE_WEB_FIXTURES), and readers.

import { readFileSync } from "node:fs";
import path from "node:path";

import { readJson as readJsonText } from "../json_text.mjs";

const root = process.env.EDGE_WEB_FIXTURES;
if (!root) {
  throw new Error(
    "EDGE_WEB_FIXTURES is not set: write the fixtures with `python tests/web/make_fixtures.py DIR` and run " +
      "`EDGE_WEB_FIXTURES=DIR node --test web/edge/test/` (or `pytest tests/web`)",
  );
}

export const fixturePath = (...parts) => path.join(root, ...parts);

export const readBytes = (...parts) => new Uint8Array(readFileSync(fixturePath(...parts)));

/** JSON written by Python (NaN and Infinity included). */
export const readJson = (...parts) => readJsonText(readFileSync(fixturePath(...parts), "utf8"));

export function readTyped(Type, ...parts) {
  const bytes = readBytes(...parts);
  return new Type(bytes.buffer, bytes.byteOffset, bytes.byteLength / Type.BYTES_PER_ELEMENT);
}

export const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (pair) => parseInt(pair, 16));

/** SNR of `estimate` against `reference` in dB, in float64 (Infinity when identical), as vllm_omni.edge.audio.snr_db. */
export function snrDb(reference, estimate) {
  let signal = 0;
  let noise = 0;
  for (let i = 0; i < reference.length; i++) {
    signal += reference[i] * reference[i];
    noise += (estimate[i] - reference[i]) ** 2;
  }
  if (noise === 0) return Infinity;
  return 10 * Math.log10(signal / noise);
}

export function maxAbsDiff(a, b) {
  let most = 0;
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i] - b[i]));
  return most;
}
