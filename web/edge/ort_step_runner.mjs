// Stateful step graphs run by onnxruntime-web: the browser class's backend, on its WebGPU or its WASM provider.
//
// One InferenceSession is one copy of the weights. A plan whose first and main roles name the same
// file (one dynamic-B graph) gets one session and two runners over it (openPlanRunners). `ort` is the
// onnxruntime-web module (the `onnxruntime-web/webgpu` bundle for WebGPU, the WASM-only one otherwise), passed in
// so the same code runs in Node (the tests) and in a Web Worker.
//
// On WebGPU the step's cache output stays on the GPU (`preferredOutputLocation`) and is fed back as the next
// step's input: a step reads back only its audio.

import { CODES_DTYPES, INPUT_NAMES, OUTPUT_NAMES, StepContractError, checkStepContract } from "./stateful_decoder.mjs";

/** Set the WASM thread count; it applies to sessions created afterwards (onnxruntime-web reads it once). */
export function configureThreads(ort, threads) {
  if (threads !== undefined && threads !== null) ort.env.wasm.numThreads = Math.max(1, Math.floor(threads));
}

const asBytes = (buffer) => (buffer instanceof Uint8Array ? buffer : new Uint8Array(buffer));

/**
 * An onnxruntime-web session over the graph's bytes (ArrayBuffer or Uint8Array). `provider`: "wasm" or "webgpu";
 * `externalData`: [{path, data}], the graph's weights as ONNX external data (path: the name the graph records);
 * `sessionOptions`: more of onnxruntime-web's session options (memory settings, a verbose log level).
 */
export async function createStepSession(
  ort,
  modelBytes,
  { threads, provider = "wasm", externalData = null, sessionOptions = {} } = {},
) {
  configureThreads(ort, threads);
  const bytes = asBytes(modelBytes);
  const options = { executionProviders: [provider], graphOptimizationLevel: "all", ...sessionOptions };
  if (externalData) options.externalData = externalData.map(({ path, data }) => ({ path, data: asBytes(data) }));
  if (provider === "webgpu") options.preferredOutputLocation = { [OUTPUT_NAMES[1]]: "gpu-buffer" };
  return ort.InferenceSession.create(bytes, options);
}

/** A runner at the contract's step size over `session`; input and output names come from the contract. */
export function stepRunner(ort, session, contract) {
  checkStepContract(contract, "step contract");
  const inputs = contract.input_names ?? INPUT_NAMES;
  const outputs = contract.output_names ?? OUTPUT_NAMES;
  const missing = [...inputs.filter((n) => !session.inputNames.includes(n)), ...outputs.filter((n) => !session.outputNames.includes(n))];
  if (inputs.length !== 4 || outputs.length !== 2 || missing.length) {
    throw new StepContractError(
      `the step graph has inputs [${session.inputNames}] and outputs [${session.outputNames}]; the contract names ` +
        `[${inputs}] and [${outputs}]`,
    );
  }
  const size = contract.step_frames;
  const q = contract.num_quantizers;
  const half = Math.floor(contract.head_dim / 2);
  const numel = contract.cache_numel;
  const codesType = contract.codes_dtype ?? CODES_DTYPES[0];
  let zeroCache = null; // made at the first step of a stream, then kept (it is never written)
  return {
    contract,
    session,
    /** `cache`: the tensor the previous step returned, or null for the zero cache a stream starts from. */
    async run(codes, freqs, cacheValid, cache) {
      zeroCache ??= new ort.Tensor("float32", new Float32Array(numel), [numel]);
      const feeds = {
        [inputs[0]]: new ort.Tensor(codesType, codes, [1, q, size]),
        [inputs[1]]: new ort.Tensor("float32", freqs, [size, half]),
        [inputs[2]]: new ort.Tensor("float32", cacheValid, [1]),
        [inputs[3]]: cache ?? zeroCache,
      };
      const results = await session.run(feeds);
      return { audio: results[outputs[0]].data, cache: results[outputs[1]] };
    },
  };
}

/** One session and a runner over it: the brief's `createStepRunner(ort, modelBytes, contract, {threads})`. */
export async function createStepRunner(ort, modelBytes, contract, options = {}) {
  return stepRunner(ort, await createStepSession(ort, modelBytes, options), contract);
}

/**
 * `{main, first}` runners of a stateful plan, one session per distinct file (with its external data file, where
 * the plan names one). `artifacts`: Map(file -> ArrayBuffer) (what loadPlan returns) or an object keyed by file;
 * `options`: createStepSession's.
 */
export async function openPlanRunners(ort, plan, artifacts, options = {}) {
  if (plan.graph_kind !== "stateful") {
    throw new StepContractError(`a ${plan.graph_kind} plan: the browser decodes stateful step graphs only`);
  }
  const roles = plan.artifacts ?? {};
  if (!roles.main) throw new StepContractError("the plan has no 'main' step artifact");
  const sessions = new Map();
  const runnerFor = async (role) => {
    const artifact = roles[role];
    if (!sessions.has(artifact.file)) {
      const bytesOf = (file) => {
        const bytes = artifacts instanceof Map ? artifacts.get(file) : artifacts[file];
        if (!bytes) throw new StepContractError(`no bytes for ${file} (role ${role})`);
        return bytes;
      };
      const weights = artifact.external_data; // beside the graph, under the name the graph records
      const externalData = weights ? [{ path: weights.file.split("/").pop(), data: bytesOf(weights.file) }] : null;
      sessions.set(artifact.file, await createStepSession(ort, bytesOf(artifact.file), { ...options, externalData }));
    }
    return stepRunner(ort, sessions.get(artifact.file), artifact.contract);
  };
  const main = await runnerFor("main");
  const first = roles.first ? await runnerFor("first") : null;
  return { main, first, sessions: [...sessions.values()] };
}
