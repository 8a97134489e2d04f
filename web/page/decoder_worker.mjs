// The page's decoder, off the main thread: a module Web Worker holding one StatefulDecoder over
// onnxruntime-web (WASM). Requests are handled one at a time, in order (each awaits the previous), so frames
// are decoded in the order they arrived.
//
// Requests {id, type, ...} -> replies {id, ok: true, ...} or {id, ok: false, error}:
//   init   {plan, artifacts: [[file, ArrayBuffer]], threads} -> {threads, seconds, sampleRate, samplesPerFrame}
//          (threads: null for min(hardwareConcurrency, 4); WASM threads need cross-origin isolation, else 1)
//   reset  {}                                         -> {}
//   frames {frames: Int32Array, count, flags}         -> {pcm: Float32Array, seconds}  (reset before, flush after
//                                                        a segment end or end of stream, as the flags say)
//   flush  {}                                         -> {pcm: Float32Array, seconds}

import * as ort from "./ort/ort.min.mjs";

import { openPlanRunners } from "./edge/ort_step_runner.mjs";
import { StatefulDecoder } from "./edge/stateful_decoder.mjs";

ort.env.wasm.wasmPaths = new URL("./ort/", import.meta.url).href;
const DEFAULT_THREADS = Math.max(1, Math.min(navigator.hardwareConcurrency || 1, 4));
const MAX_THREADS = 16;

let decoder = null;

function concat(a, b) {
  if (!a.length) return b;
  if (!b.length) return a;
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

const handlers = {
  async init({ plan, artifacts, threads = null }) {
    const started = performance.now();
    const asked = Number.isSafeInteger(threads) ? Math.max(1, Math.min(threads, MAX_THREADS)) : DEFAULT_THREADS;
    const { main, first } = await openPlanRunners(ort, plan, new Map(artifacts), {
      threads: self.crossOriginIsolated ? asked : 1,
    });
    decoder = new StatefulDecoder(main, first);
    return {
      threads: ort.env.wasm.numThreads,
      seconds: (performance.now() - started) / 1000,
      sampleRate: decoder.sampleRate,
      samplesPerFrame: decoder.samplesPerFrame,
    };
  },
  async reset() {
    decoder?.reset();
    return {};
  },
  async frames({ frames, count, flags }) {
    if (!decoder) throw new Error("the decoder has no plan yet");
    const started = performance.now();
    if (flags.reset) decoder.reset();
    let pcm = await decoder.feed(frames, count);
    if (flags.segmentEnd || flags.endOfStream) pcm = concat(pcm, await decoder.flush());
    return { pcm, seconds: (performance.now() - started) / 1000 };
  },
  async flush() {
    if (!decoder) return { pcm: new Float32Array(0), seconds: 0 };
    const started = performance.now();
    const pcm = await decoder.flush();
    return { pcm, seconds: (performance.now() - started) / 1000 };
  },
};

let queue = Promise.resolve();
self.onmessage = ({ data }) => {
  queue = queue.then(async () => {
    try {
      const reply = await handlers[data.type](data);
      self.postMessage({ id: data.id, ok: true, ...reply }, reply.pcm ? [reply.pcm.buffer] : []);
    } catch (error) {
      self.postMessage({ id: data.id, ok: false, error: `${error.name ?? "Error"}: ${error.message ?? error}` });
    }
  });
};
