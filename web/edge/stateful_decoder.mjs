// Drive stateful step graphs over a stream: the mirror of vllm_omni/edge/runtime/stateful_decoder.py.
//
// A runner is `{contract, async run(codes, freqs, cacheValid, cache) -> {audio, cache}}`:
//   codes      BigInt64Array [1, Q, B]  the new frames, codebook-major
//   freqs      Float32Array  [B, D/2]   RoPE angles pos * inv_freq, reduced mod 2*pi here on the host
//   cacheValid Float32Array  [1]        real KV slots: min(position, kv_slots)
//   cache      Float32Array  [N]        the flat cache (N does not depend on B: steps of any size share it)
// -> audio Float32Array [B * hop], cache Float32Array [N].
// The contract is the plan's step contract JSON (snake_case, as vllm_omni/edge/graphs/step_contract.py
// writes it). Frames arrive in any amounts; audio leaves as soon as a whole step's worth is there.
// flush() pads the last step with code 0; the decoder is causal, so the padding cannot change the audio of
// real frames, and the padding's own audio is cut off.

import stepSchema from "./schemas/step_contract.schema.json" with { type: "json" };

import { isWrittenInteger, jsonType, shown, shownAt } from "./json_text.mjs";

/** A step contract this runtime will not allocate from. `field`: the contract's field at fault ("" for the whole). */
export class StepContractError extends Error {
  constructor(message, field = "") {
    super(message);
    this.name = "StepContractError";
    this.field = field;
  }
}

/** Frames handed to a decoder that do not fit its contract; the stream state is unchanged. */
export class InvalidFramesError extends Error {
  constructor(message) {
    super(message);
    this.name = "InvalidFramesError";
  }
}

// The contract's fields and bounds are data: vllm_omni/edge/plan/schemas/step_contract.schema.json, which
// vllm_omni/edge/graphs/step_contract.py reads too (served beside this module as ./schemas/, a link to that folder
// in the checkout). The checks below are step_contract.py's, in its order: tests/data/plan_cases.json holds the
// contracts both must accept or refuse, a refusal naming the same field.
const FIELDS = stepSchema.properties;
export const STEP_SCHEMA_VERSION = FIELDS.schema_version.const;
/** [key, minimum, maximum] of each integer field, in the schema's order (the order both readers check them in). */
export const COUNT_BOUNDS = Object.entries(FIELDS)
  .filter(([, rule]) => rule.type === "integer")
  .map(([key, rule]) => [key, rule.minimum, rule.maximum]);
const MAX_LAYOUT_ENTRIES = FIELDS.cache_layout.maxItems;
const SHAPE = FIELDS.cache_layout.items.prefixItems[3];
const MAX_LAYOUT_RANK = SHAPE.maxItems;
const MAX_LAYOUT_DIM = SHAPE.items.maximum;
export const INPUT_NAMES = FIELDS.input_names.const;
export const OUTPUT_NAMES = FIELDS.output_names.const;
/** audio_codes' element types a contract may name; the first is the default (a contract naming none). */
export const CODES_DTYPES = FIELDS.codes_dtype.enum;

/** `container[key]` is a count: an integer >= 0 written as one (`16.0` and `true` are not, as on the server). */
const isCount = (container, key) => isWrittenInteger(container, key) && container[key] >= 0;

/** The cache layout rows `[name, offset, numel, shape]`, read strictly, as step_contract.py's CacheLayout. */
function checkCacheLayout(rows, source) {
  const refuse = (message) => new StepContractError(`${source}: cache_layout: ${message}`, "cache_layout");
  if (!Array.isArray(rows) || rows.length > MAX_LAYOUT_ENTRIES) {
    const found = Array.isArray(rows) ? `${rows.length} rows` : jsonType(rows);
    throw refuse(`expected an array of at most ${MAX_LAYOUT_ENTRIES} rows, found ${found}`);
  }
  rows.forEach((row, index) => {
    const shape = Array.isArray(row) ? row[3] : undefined;
    const wellFormed =
      Array.isArray(row) &&
      row.length === 4 &&
      typeof row[0] === "string" &&
      isCount(row, 1) &&
      isCount(row, 2) &&
      Array.isArray(shape) &&
      shape.length <= MAX_LAYOUT_RANK &&
      shape.every((size, i) => isCount(shape, i) && size <= MAX_LAYOUT_DIM);
    if (!wellFormed) {
      throw refuse(
        `row ${index} is ${shown(row, 80)}; each row is [name, offset, numel, shape] with integer counts >= 0, ` +
          `a shape of at most ${MAX_LAYOUT_RANK} dimensions of at most ${MAX_LAYOUT_DIM}`,
      );
    }
  });
  let offset = 0;
  for (const [name, start, numel, shape] of rows) {
    const product = shape.reduce((total, size) => total * BigInt(size), 1n);
    if (start !== offset || BigInt(numel) !== product) {
      throw refuse(
        `region ${shown(name)} starts at ${start} with ${numel} floats; it should start at ${offset} (where the ` +
          `region before it ends) and hold ${product} floats (its shape ${shown(shape)})`,
      );
    }
    offset += numel;
  }
  return offset;
}

/**
 * Check a step contract as a runtime reads it before allocating from it (vllm_omni/edge/graphs/step_contract.py's
 * StepContract.from_json: the same checks in the same order); returns the contract. A refusal is a
 * StepContractError naming the field at fault. A contract read with readJson (./json_text.mjs) keeps how its numbers
 * were written: a count written `16.0` is refused, as on the server.
 */
export function checkStepContract(contract, source = "the step contract") {
  if (contract === null || typeof contract !== "object" || Array.isArray(contract)) {
    throw new StepContractError(`${source} is not a JSON object (found ${jsonType(contract)})`);
  }
  const refuse = (field, message) => new StepContractError(`${source}: ${field}: ${message}`, field);
  const read = (key) => {
    if (!Object.hasOwn(contract, key)) {
      throw refuse(
        key,
        "missing: this is not a Qwen3-TTS stateful step graph exported by vllm_omni.edge (re-export it with " +
          "export_step_onnx)",
      );
    }
    return contract[key];
  };
  const version = read("schema_version");
  if (!(isCount(contract, "schema_version") && version === STEP_SCHEMA_VERSION)) {
    throw refuse(
      "schema_version",
      `this runtime reads step schema ${STEP_SCHEMA_VERSION}, found ${shownAt(contract, "schema_version", 20)}: ` +
        "re-export the graph with this version",
    );
  }
  const frequencies = read("rope_inv_freq");
  if (!Array.isArray(frequencies) || !frequencies.every((f) => typeof f === "number" && Number.isFinite(f))) {
    throw refuse("rope_inv_freq", `expected an array of finite numbers, found ${shown(frequencies)}`);
  }
  const geometry = read("geometry");
  if (geometry === null || typeof geometry !== "object" || Array.isArray(geometry)) {
    throw refuse("geometry", `expected a JSON object, found ${jsonType(geometry)}`);
  }
  const count = (key, low, high) => {
    const value = read(key);
    if (!isCount(contract, key) || value < low || value > high) {
      throw refuse(key, `expected an integer in ${low}..${high}, found ${shownAt(contract, key)}`);
    }
  };
  for (const [key, low, high] of COUNT_BOUNDS) if (key !== "max_step_frames") count(key, low, high);
  const layoutNumel = checkCacheLayout(read("cache_layout"), source);
  const dynamic = Object.hasOwn(contract, "max_step_frames");
  if (dynamic) count("max_step_frames", ...COUNT_BOUNDS.find(([key]) => key === "max_step_frames").slice(1));
  if (dynamic && contract.step_frames > contract.max_step_frames) {
    throw refuse(
      "step_frames",
      `${contract.step_frames} frames per step, more than the graph takes ` +
        `(max_step_frames ${contract.max_step_frames})`,
    );
  }
  if (layoutNumel !== contract.cache_numel) {
    throw refuse("cache_numel", `${contract.cache_numel}, but the cache layout's regions hold ${layoutNumel} floats`);
  }
  if (frequencies.length !== Math.floor(contract.head_dim / 2)) {
    throw refuse(
      "rope_inv_freq",
      `${frequencies.length} frequencies; head_dim ${contract.head_dim} takes ${Math.floor(contract.head_dim / 2)}`,
    );
  }
  if (Object.hasOwn(contract, "codes_dtype") && !CODES_DTYPES.includes(contract.codes_dtype)) {
    throw refuse("codes_dtype", `expected one of ${CODES_DTYPES.join(", ")}, found ${shown(contract.codes_dtype, 20)}`);
  }
  return contract;
}

function sharesCache(a, b) {
  return (
    a.cache_numel === b.cache_numel &&
    JSON.stringify(a.cache_layout ?? null) === JSON.stringify(b.cache_layout ?? null) &&
    JSON.stringify(a.rope_inv_freq) === JSON.stringify(b.rope_inv_freq)
  );
}

const TWO_PI = 2 * Math.PI;

/**
 * Float32Array [count, D/2]: angles of positions start .. start+count-1, reduced mod 2*pi; bit-identical to
 * Python's rope_angles: the product in float32 (two float32 multiply exactly in float64, one rounding by
 * Math.fround makes it the float32 product), the remainder in float64 (positive angles: % is fmod, as
 * np.mod), then rounded to float32.
 */
export function ropeAngles(start, count, invFreq) {
  const frequencies = invFreq instanceof Float32Array ? invFreq : Float32Array.from(invFreq);
  const half = frequencies.length;
  const angles = new Float32Array(count * half);
  for (let i = 0; i < count; i++) {
    const position = Math.fround(start + i);
    for (let j = 0; j < half; j++) {
      const angle = Math.fround(position * frequencies[j]);
      angles[i * half + j] = angle % TWO_PI; // a Float32Array store rounds to float32
    }
  }
  return angles;
}

function concatFloat32(pieces) {
  const total = pieces.reduce((sum, piece) => sum + piece.length, 0);
  const out = new Float32Array(total);
  let offset = 0;
  for (const piece of pieces) {
    out.set(piece, offset);
    offset += piece.length;
  }
  return out;
}

/**
 * Exact streaming decode of one stream: `feed(frames, count)` -> PCM, `flush()` at the end, `reset()`.
 *
 * A runner (ort_step_runner.mjs) has a `contract` and `run(codes, freqs, cacheValid, cache)` -> `{audio, cache}`:
 * codes typed as the contract's codes_dtype, `cache` the previous step's returned cache or null for a zero one,
 * and the returned cache a tensor with `size` (and `dispose()` where it holds GPU memory) that only the next step
 * reads: on WebGPU it stays on the GPU, and only the audio is read back.
 */
export class StatefulDecoder {
  constructor(main, first = null) {
    this.main = main;
    this.first = first ?? null;
    const contract = checkStepContract(main.contract, "main step");
    if (this.first !== null) {
      checkStepContract(this.first.contract, "first step");
      if (!sharesCache(this.first.contract, contract)) {
        throw new StepContractError(
          `first step (B=${this.first.contract.step_frames}, N=${this.first.contract.cache_numel}) and main step ` +
            `(B=${contract.step_frames}, N=${contract.cache_numel}) do not share a cache layout; export both from ` +
            "the same checkpoint",
        );
      }
    }
    this.contract = contract;
    this.numQuantizers = contract.num_quantizers;
    this.samplesPerFrame = contract.hop;
    this.sampleRate = contract.sample_rate;
    this._invFreq = Float32Array.from(contract.rope_inv_freq);
    this.reset();
  }

  /** Forget the stream: zero cache, position 0, no pending frames. */
  reset() {
    this._release(null);
    this._position = 0;
    this._pending = new Int32Array(0);
  }

  /** Frames decoded so far in this stream. */
  get position() {
    return this._position;
  }

  get pendingFrames() {
    return this._pending.length / this.numQuantizers;
  }

  /** Throws InvalidFramesError unless `frames` holds `count` frame-major frames of codes in range. */
  checkFrames(frames, count) {
    const q = this.numQuantizers;
    const size = this.contract.codebook_size;
    if (!Number.isInteger(count) || count < 0 || frames.length !== count * q) {
      throw new InvalidFramesError(`frames must have shape [T, ${q}] (frame-major): ${frames.length} codes for ${count} frames`);
    }
    for (let i = 0; i < frames.length; i++) {
      const code = frames[i];
      if (!Number.isInteger(code) || code < 0 || code >= size) {
        const frame = Math.floor(i / q);
        throw new InvalidFramesError(
          `codes must lie in 0..${size - 1}, found ${code} at [frame, codebook] = [${frame}, ${i % q}] ` +
            `(stream position ${this._position + this.pendingFrames + frame})`,
        );
      }
    }
  }

  /** Queue `count` frames (Int32Array [count x Q], frame-major) and decode every whole step now possible. */
  async feed(frames, count = frames.length / this.numQuantizers) {
    this.checkFrames(frames, count);
    const pending = new Int32Array(this._pending.length + frames.length);
    pending.set(this._pending);
    pending.set(frames, this._pending.length);
    this._pending = pending;
    const pieces = [];
    for (;;) {
      const runner = this._nextRunner();
      const size = runner.contract.step_frames;
      if (this.pendingFrames < size) break;
      const block = this._pending.subarray(0, size * this.numQuantizers);
      pieces.push(await this._step(runner, block, size));
      this._pending = this._pending.slice(size * this.numQuantizers);
    }
    return concatFloat32(pieces);
  }

  /** End the stream: decode the frames still pending (the last step padded with code 0), return their PCM, reset. */
  async flush() {
    const pieces = [];
    const q = this.numQuantizers;
    while (this._pending.length) {
      const pendingFrames = this.pendingFrames;
      const runners = [this.first, this.main].filter((runner) => runner !== null);
      const fitting = runners.filter((runner) => runner.contract.step_frames >= pendingFrames);
      const runner = fitting.length
        ? fitting.reduce((best, r) => (r.contract.step_frames < best.contract.step_frames ? r : best))
        : this._nextRunner();
      const size = runner.contract.step_frames;
      const real = Math.min(pendingFrames, size);
      const block = new Int32Array(size * q);
      block.set(this._pending.subarray(0, real * q));
      pieces.push(await this._step(runner, block, real));
      this._pending = this._pending.slice(real * q);
    }
    this.reset();
    return concatFloat32(pieces);
  }

  _nextRunner() {
    return this.first !== null && this._position === 0 ? this.first : this.main;
  }

  /** Drop the cache this stream holds (a runner's tensor, maybe on the GPU) for `next` (null: a zero cache). */
  _release(next) {
    if (this._cache && this._cache !== next) this._cache.dispose?.();
    this._cache = next;
  }

  async _step(runner, frames, realFrames) {
    const size = runner.contract.step_frames;
    const q = this.numQuantizers;
    const wide = (runner.contract.codes_dtype ?? CODES_DTYPES[0]) === "int64";
    const codes = wide ? new BigInt64Array(q * size) : new Int32Array(q * size);
    for (let t = 0; t < size; t++) {
      for (let k = 0; k < q; k++) codes[k * size + t] = wide ? BigInt(frames[t * q + k]) : frames[t * q + k];
    }
    const freqs = ropeAngles(this._position, size, this._invFreq);
    const valid = Float32Array.of(Math.min(this._position, this.contract.kv_slots));
    const { audio, cache } = await runner.run(codes, freqs, valid, this._cache);
    if (cache.size !== this.contract.cache_numel) {
      cache.dispose?.();
      throw new StepContractError(`the step returned a cache of ${cache.size} floats, expected ${this.contract.cache_numel}`);
    }
    this._release(cache);
    this._position += realFrames;
    return Float32Array.from(audio.subarray(0, realFrames * this.samplesPerFrame));
  }
}
