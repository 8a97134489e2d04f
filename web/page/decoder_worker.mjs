// The page's decoder, off the main thread: a module Web Worker holding one StatefulDecoder over onnxruntime-web,
// on its WebGPU provider where the browser gives a hardware adapter, on WASM otherwise. Requests are handled one
// at a time, in order (each awaits the previous), so frames are decoded in the order they arrived.
//
// Requests {id, type, ...} -> replies {id, ok: true, ...} or {id, ok: false, error}:
//   init   {plan, artifacts: [[file, ArrayBuffer]], threads, provider, softwareAdapter, placement, sessionOptions}
//          -> {provider, adapter, fallback, threads, seconds, warmSeconds, warmRtf, sampleRate, samplesPerFrame,
//              placement}
//          provider: "auto" (WebGPU when an adapter is there, else WASM), "webgpu" or "wasm". A software adapter
//          (SwiftShader: Chromium without a GPU) is slower than WASM and is used only with softwareAdapter (tests).
//          threads: WASM threads, null for hardwareConcurrency; they need cross-origin isolation, else 1.
//          Both step sizes run once at init (WebGPU compiles its shaders then), so the first audio waits for none;
//          a second main step, timed, gives warmRtf: the decode's seconds per second of audio.
//          sessionOptions: more onnxruntime-web session options (the benchmark's memory settings).
//          placement (tests): the provider onnxruntime put each node on, from its verbose log
//          {provider: [[op type, node name]]} (after its graph optimizations: fused nodes have new names).
//   reset  {}                                         -> {}
//   frames {frames: Int32Array, count, flags}         -> {pcm: Float32Array, seconds}  (reset before, flush after
//                                                        a segment end or end of stream, as the flags say)
//   flush  {}                                         -> {pcm: Float32Array, seconds}

import { openPlanRunners } from "./edge/ort_step_runner.mjs";
import { StatefulDecoder } from "./edge/stateful_decoder.mjs";

// The WASM-only bundle is half the runtime's bytes; the WebGPU bundle (onnxruntime's native WebGPU provider, which
// also runs WASM) is loaded only for a WebGPU adapter.
const BUNDLES = { wasm: "./ort/ort.wasm.min.mjs", webgpu: "./ort/ort.webgpu.min.mjs" };
const DEFAULT_THREADS = Math.max(1, navigator.hardwareConcurrency || 1); // at most MAX_THREADS
const MAX_THREADS = 16;
const PROVIDERS = ["auto", "webgpu", "wasm"];
const SOFTWARE_ARCHITECTURES = ["swiftshader"];

let decoder = null;
let placementLog = null; // the verbose log's placement lines while a session with placement is made

function concat(a, b) {
  if (!a.length) return b;
  if (!b.length) return a;
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

let consoleTapped = false;

/** onnxruntime's log goes to the console; its placement lines are kept while placementLog is set. */
function tapConsole() {
  if (consoleTapped) return;
  consoleTapped = true;
  for (const level of ["log", "info", "warn", "error"]) {
    const original = console[level].bind(console);
    console[level] = (...args) => {
      if (placementLog && typeof args[0] === "string" && args[0].includes("VerifyEachNodeIsAssignedToAnEp")) {
        placementLog.push(args[0]);
        return;
      }
      original(...args);
    };
  }
}

/** `{provider: [[op type, node name]]}` from onnxruntime's "Node(s) placed on [P]" lines and the node lines after. */
function readPlacement(lines) {
  const placement = {};
  let current = null;
  for (const line of lines) {
    const header = /Node\(s\) placed on \[(\w+)\]/.exec(line);
    if (header) {
      current = placement[header[1]] ??= [];
      continue;
    }
    const node = /VerifyEachNodeIsAssignedToAnEp\]\s+(\S+) \((.*)\)\s*$/.exec(line);
    if (node && current) current.push([node[1], node[2]]);
  }
  return placement;
}

/** The WebGPU adapter to decode on, or why there is none: {adapter, info, reason}. */
async function webgpuAdapter(softwareAdapter) {
  if (!globalThis.navigator?.gpu) return { adapter: null, reason: "this browser has no WebGPU (navigator.gpu)" };
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  } catch (error) {
    return { adapter: null, reason: `WebGPU gave no adapter: ${error.message ?? error}` };
  }
  if (!adapter) return { adapter: null, reason: "WebGPU gave no adapter (no GPU, or it is blocklisted)" };
  const info = adapter.info ?? {};
  const summary = { vendor: info.vendor ?? "", architecture: info.architecture ?? "", description: info.description ?? "" };
  const software = Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter) || SOFTWARE_ARCHITECTURES.includes(summary.architecture);
  if (software && !softwareAdapter) {
    return { adapter: null, info: summary, reason: `the WebGPU adapter is software (${summary.architecture || "fallback"}): WASM is faster` };
  }
  return { adapter, info: summary, reason: null };
}

/**
 * Run each distinct step size once on zero codes, then the main step again, timed: shaders and kernels are made
 * before any audio, and the second main step's seconds per second of audio are the page's speed before it has
 * decoded anything (`rtf`: what the page weighs against real time at an utterance's start). The stream is reset.
 */
async function warm(main, first) {
  const started = performance.now();
  const zeros = (runner) => new Int32Array(runner.contract.step_frames * runner.contract.num_quantizers);
  for (const runner of new Set([first, main].filter(Boolean))) {
    const decoderForSize = new StatefulDecoder(runner);
    await decoderForSize.feed(zeros(runner), runner.contract.step_frames);
    decoderForSize.reset();
  }
  const timed = new StatefulDecoder(main);
  const before = performance.now();
  const audio = await timed.feed(zeros(main), main.contract.step_frames);
  const rtf = (performance.now() - before) / 1000 / (audio.length / timed.sampleRate);
  timed.reset();
  return { seconds: (performance.now() - started) / 1000, rtf };
}

const handlers = {
  async init({ plan, artifacts, threads = null, provider = "auto", softwareAdapter = false, placement = false, sessionOptions = {} }) {
    const started = performance.now();
    if (!PROVIDERS.includes(provider)) throw new Error(`provider must be one of ${PROVIDERS.join(", ")}, got ${provider}`);
    const asked = Math.min(Number.isSafeInteger(threads) ? Math.max(1, threads) : DEFAULT_THREADS, MAX_THREADS);
    let chosen = "wasm";
    let fallback = provider === "wasm" ? "asked for WASM" : null;
    let adapterInfo = null;
    if (provider !== "wasm") {
      const found = await webgpuAdapter(softwareAdapter);
      adapterInfo = found.info ?? null;
      if (found.adapter) chosen = "webgpu";
      else fallback = found.reason;
      if (provider === "webgpu" && !found.adapter) throw new Error(`WebGPU was asked for: ${found.reason}`);
    }
    if (placement) {
      tapConsole();
      placementLog = [];
    }
    const open = async (provider) => {
      const ort = await import(BUNDLES[provider]);
      ort.env.wasm.wasmPaths = new URL("./ort/", import.meta.url).href;
      const options = {
        threads: self.crossOriginIsolated ? asked : 1,
        provider,
        sessionOptions: { ...sessionOptions, ...(placement ? { logSeverityLevel: 0 } : {}) },
      };
      const runners = await openPlanRunners(ort, plan, new Map(artifacts), options);
      try {
        // many GPU faults (shader or buffer limits) show only when a step runs: warming is part of opening
        return { ort, runners, warmed: await warm(runners.main, runners.first) };
      } catch (error) {
        for (const session of runners.sessions) await session.release().catch(() => {});
        throw error;
      }
    };
    let ort, runners, warmed;
    try {
      try {
        ({ ort, runners, warmed } = await open(chosen));
      } catch (error) {
        if (chosen !== "webgpu" || provider === "webgpu") throw error;
        chosen = "wasm"; // auto: a GPU that cannot run the graph still leaves WASM
        fallback = `WebGPU could not open the step graph (${error.message ?? error})`;
        ({ ort, runners, warmed } = await open(chosen));
      }
    } finally {
      artifacts.length = 0; // the worker keeps no copy of the weights once the session holds them
    }
    const log = placementLog;
    placementLog = null;
    decoder = new StatefulDecoder(runners.main, runners.first);
    return {
      provider: chosen,
      adapter: chosen === "webgpu" ? adapterInfo : null,
      fallback,
      threads: chosen === "wasm" ? ort.env.wasm.numThreads : null,
      seconds: (performance.now() - started) / 1000,
      warmSeconds: warmed.seconds,
      warmRtf: warmed.rtf,
      sampleRate: decoder.sampleRate,
      samplesPerFrame: decoder.samplesPerFrame,
      placement: log ? readPlacement(log) : null,
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
