// The stateful decoder in onnxruntime-web (WASM, in Node) against the Python decodes of the same frames:
// the torch full decode (>= 100 dB) and the Python StatefulDecoder over native onnxruntime.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as ort from "onnxruntime-web";

import { openPlanRunners } from "../ort_step_runner.mjs";
import { InvalidFramesError, StatefulDecoder, StepContractError, ropeAngles } from "../stateful_decoder.mjs";
import { fixturePath, maxAbsDiff, readJson, readTyped, snrDb } from "../testing/fixtures.mjs";

const EXACT_DB = 100;
const cases = readJson("decode", "cases.json");
const plan = JSON.parse(readFileSync(fixturePath("decode", cases.plan_dir, "exec_plan.json"), "utf8"));
const utterance = (name) => {
  const row = cases.utterances.find((u) => u.name === name);
  return {
    ...row,
    codes: readTyped(Int32Array, "decode", `${name}.codes.i32`),
    full: readTyped(Float32Array, "decode", `${name}.full.f32`),
    stepwise: readTyped(Float32Array, "decode", `${name}.stepwise.f32`),
  };
};

test("the browser plan's graph takes int32 codes (no int64 kernel for WebGPU)", () => {
  const expected = cases.hardware_class === "browser" ? "int32" : undefined;
  for (const role of ["main", "first"]) assert.equal(plan.artifacts[role].contract.codes_dtype, expected, role);
});

async function openDecoder() {
  const files = new Set(Object.values(plan.artifacts).flatMap((a) => [a.file, a.external_data?.file].filter(Boolean)));
  const artifacts = new Map([...files].map((file) => [file, readFileSync(fixturePath("decode", cases.plan_dir, file))]));
  const { main, first, sessions } = await openPlanRunners(ort, plan, artifacts, { threads: 1 });
  assert.equal(sessions.length, 1, "first and main share one session (one file)");
  return new StatefulDecoder(main, first);
}

function concat(pieces) {
  const out = new Float32Array(pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const piece of pieces) {
    out.set(piece, at);
    at += piece.length;
  }
  return out;
}

/** Feed `codes` in pieces of the given frame counts (cycled), then flush. */
async function decodeInPieces(decoder, codes, q, pieces) {
  const frames = codes.length / q;
  const out = [];
  for (let at = 0, i = 0; at < frames; i++) {
    const count = Math.min(pieces[i % pieces.length], frames - at);
    out.push(await decoder.feed(codes.subarray(at * q, (at + count) * q), count));
    at += count;
  }
  out.push(await decoder.flush());
  return concat(out);
}

test("ropeAngles equals Python's rope_angles bit for bit", () => {
  const invFreq = plan.artifacts.main.contract.rope_inv_freq;
  for (const { start, count, file } of cases.rope) {
    const expected = readTyped(Uint32Array, "decode", file);
    const found = new Uint32Array(ropeAngles(start, count, invFreq).buffer);
    assert.deepStrictEqual(found, expected, `positions ${start}..${start + count - 1}`);
  }
});

test("onnxruntime-web stepwise decode equals the Python full decode over a mixed schedule", async (t) => {
  const decoder = await openDecoder();
  const q = plan.num_quantizers;
  const first = utterance("long");
  const second = utterance("short");
  const stale = utterance("stale");
  const one = utterance("one_frame");
  const report = [];

  // utterance 1: first step (B=2), main steps (B=4), pieces that straddle steps, a padded flush
  const audio1 = await decodeInPieces(decoder, first.codes, q, [1, 3, 5, 2, 7]);
  assert.equal(decoder.position, 0, "flush resets");
  // a stream cut by a reset mid-step: stale frames decoded and pending, then dropped
  const staleAudio = await decoder.feed(stale.codes, stale.frames);
  assert.equal(staleAudio.length, 2 * plan.samples_per_frame);
  assert.equal(decoder.pendingFrames, 1);
  decoder.reset();
  assert.equal(decoder.position, 0);
  assert.equal(decoder.pendingFrames, 0);
  // utterance 2 after the reset, then a one-frame utterance (flushed through the first step alone)
  const audio2 = await decodeInPieces(decoder, second.codes, q, [4, 1]);
  const audio3 = await decodeInPieces(decoder, one.codes, q, [1]);

  for (const [row, audio] of [[first, audio1], [second, audio2], [one, audio3]]) {
    assert.equal(audio.length, row.full.length, `${row.name}: samples`);
    const vsFull = snrDb(row.full, audio);
    const vsPython = snrDb(row.stepwise, audio);
    report.push(
      `${row.name} (${row.frames} frames): ${vsFull.toFixed(1)} dB vs full decode, ${vsPython.toFixed(1)} dB vs ` +
        `Python stepwise (max abs ${maxAbsDiff(row.stepwise, audio).toExponential(2)})`,
    );
    assert.ok(vsFull >= EXACT_DB, `${row.name}: ${vsFull.toFixed(1)} dB against the full decode, expected >= ${EXACT_DB}`);
    assert.ok(vsPython >= EXACT_DB, `${row.name}: ${vsPython.toFixed(1)} dB against the Python stepwise decode`);
  }
  t.diagnostic(report.join("; "));
});

test("invalid frames are refused and leave the stream unchanged", async () => {
  const decoder = await openDecoder();
  const q = plan.num_quantizers;
  await decoder.feed(new Int32Array(q), 1);
  assert.throws(() => decoder.checkFrames(new Int32Array(q + 1), 1), InvalidFramesError);
  await assert.rejects(decoder.feed(Int32Array.from({ length: q }, () => 4096), 1), /codes must lie in 0..2047/);
  assert.equal(decoder.pendingFrames, 1);
});

test("a first step that does not share the main step's cache is refused", () => {
  const main = { contract: plan.artifacts.main.contract, run: async () => ({}) };
  const other = { contract: { ...plan.artifacts.first.contract, cache_numel: 8, cache_layout: [["x", 0, 8, [8]]] } };
  assert.throws(() => new StatefulDecoder(main, other), StepContractError);
});
