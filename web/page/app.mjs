// The page: fetch the browser plan (verified once, kept in Cache Storage), open the codec-stream WebSocket,
// parse each message (./edge/stream.mjs), decode frames in a Web Worker (./decoder_worker.mjs) and play the
// PCM through an AudioWorklet with a jitter buffer (./playback_worklet.mjs).
//
// Every failure (a hostile stream, a plan with a bad sha256, a wrong API key, a dead server) ends in one
// message in #status (class "error") and leaves the page usable: the buttons come back, and the next Speak
// starts a fresh utterance.
//
// "Stream as typed" (#stream-typed): the first keystroke opens a session with "text_mode": "stream" (one talker
// request, one segment, speech starting with the first words), each edit that appends to the field sends what it
// appended as a `text` piece, Speak or Enter sends `end`, Stop sends `cancel` (docs/serving/browser.md says how
// edits that are not appends are handled: TypedUtterance below).
//
// The address: `#api_key=KEY` fills the key field (a fragment is in no request: no server log, no Referer),
// then leaves the address bar and this tab's history; `?api_key=` is ignored (the status line says so);
// `?threads=N` sets the WASM threads; `#load_plan=0` (with the test hook) leaves the plan for reloadPlan; `?provider=wasm` (or `webgpu`) picks the decoder's provider (default `auto`:
// WebGPU where the browser has a hardware adapter); `#edge_test=1` installs the test hook below.
//
// Memory: the page keeps counts of what it decoded, not the audio: PCM goes to the AudioWorklet, which drops
// what it played. Only with the test hook does an utterance keep frames and PCM for the test to read, and then
// at most its first CAPTURE_FRAMES frames and their PCM (Capture), so a session of any length holds a bounded
// amount of audio.
//
// window.edgeTest (the test hook the Python browser test drives; only with `#edge_test=1` in the address):
//   ready: Promise<void>        the first plan load and voice list were attempted (errors are in #status)
//   speak(text, {voice, cancelAfterFrames, handoverRtf, loadHandoverRtf}) -> {frameCount, sampleCount, frames, pcm, captureComplete,
//        firstAudioSeconds, rtf, bytes, planSeconds, error, doneReason, segmentEnds, resets, handover}: frames, pcm,
//        segmentEnds and resets cover the first CAPTURE_FRAMES frames (captureComplete: all of them); handover:
//        null, or {fromFrame, rtf, serverSamples} when the page switched to the server's audio (handoverRtf: the
//        bar of the switch after MEASURE_FRAMES frames, loadHandoverRtf: of the switch at the start by the speed
//        measured at load; instead of HANDOVER_RTF; 0 forces one, 1e9 rules it out)
//   playRecording(bytes: number[]) -> as speak: a codec-stream recording ("QCS\x01" framing) through the same
//        parser, decoder worker and status line as the WebSocket's messages (hostile and cut-off streams)
//   setHandover({handoverRtf, loadHandoverRtf}): the hand-over's bars for every utterance after (speak's own win)
//   setApiKey(key), reloadPlan({threads, provider, softwareAdapter, placement, sessionOptions}) -> {planSeconds, threads, cached,
//        error, provider, adapter, fallback, warmSeconds, placement}   (threads, provider: as ?threads=N,
//        ?provider=; softwareAdapter: decode on a software WebGPU adapter (SwiftShader) too; placement: the
//        provider of each node, from onnxruntime's verbose log; sessionOptions: onnxruntime-web's, added;
//        hardwareClass: another stateful ONNX class's plan, as the benchmark compares graph layouts)
//   typedResult() -> as speak, plus {textPieces, framesAtEnd}, of the last utterance streamed as typed (null:
//        none yet), once it is over: the pieces sent, and the frames received when `end` was sent
//   memory() -> {frames, samples, framesReceived, samplesDecoded, captureFrames, samplesPerFrame}: the frames and
//        samples the page holds now (the utterance in progress and the last typed result), and how many it has
//        received and decoded since it loaded

import { checkStreamStart, loadPlan } from "./edge/plan.mjs";
import { readPcmMessage, serverAudioRequest } from "./edge/server_audio.mjs";
import { serverMessage } from "./edge/server_message.mjs";
import { sessionLimits, textPieces } from "./edge/session_limits.mjs";
import { CodecStreamError, CodecStreamParser, PROTOCOL, SOCKET_PATH } from "./edge/stream.mjs";

const HARDWARE_CLASS = "browser";
const VOICES_PATH = "/v1/audio/voices";
const CACHE_NAME = "vllm-omni-edge-plans";
const JITTER_SECONDS = 0.2;
const RECORDING_PIECE_BYTES = 4096;
const CAPTURE_FRAMES = 512; // with the test hook: the frames (and their PCM) an utterance keeps for the test
// The hand-over: a decode slower than HANDOVER_RTF (seconds of decoding per second of audio; 1 is just real time, and
// the jitter buffer needs room), by the timed step at load or over the utterance so far once the page has decoded
// MEASURE_FRAMES frames of it, switches the rest of the utterance to audio the server decodes, on the same socket.
// The choice is made again for each utterance.
const MEASURE_FRAMES = 24;
const HANDOVER_RTF = 0.9;
// The word being typed (held back until it ends, so fixing it is no edit of sent text): letters, digits, marks,
// apostrophes and hyphens, except in scripts written without spaces (Han and kana are sent as they come).
const WORD_CHAR = /^(?![\p{sc=Han}\p{sc=Hiragana}\p{sc=Katakana}])[\p{L}\p{N}\p{M}'\u2019-]$/u;

const $ = (id) => document.getElementById(id);
const ui = {
  text: $("text"),
  voice: $("voice"),
  speak: $("speak"),
  stop: $("stop"),
  streamTyped: $("stream-typed"),
  apiKey: $("api-key"),
  reloadPlan: $("reload-plan"),
  status: $("status"),
  firstAudio: $("first-audio"),
  rtf: $("rtf"),
  bytes: $("bytes"),
  planSeconds: $("plan-seconds"),
  details: $("details"),
};

// -- the page's address -----------------------------------------------------------------------------------

/** The address's fragment as [name, value, raw part] (no `+` as space: a key may hold one). */
function fragmentParts(hash) {
  const parts = [];
  for (const raw of hash.replace(/^#/, "").split("&")) {
    if (!raw) continue;
    const at = raw.indexOf("=");
    const [name, value] = at < 0 ? [raw, ""] : [raw.slice(0, at), raw.slice(at + 1)];
    try {
      parts.push([decodeURIComponent(name), decodeURIComponent(value), raw]);
    } catch {
      parts.push([name, value, raw]);
    }
  }
  return parts;
}

/**
 * What the address asks for. `#api_key=KEY` fills the key field, then leaves the address bar and this tab's
 * history (history.replaceState). `?api_key=` is not used: the request for the page has already carried it to
 * the server (its access log); it leaves the address too, and `notice` says why without the key.
 */
function readAddress() {
  const url = new URL(location.href);
  const parts = fragmentParts(url.hash);
  const key = parts.findLast(([name]) => name === "api_key")?.[1] ?? "";
  const queryKey = url.searchParams.has("api_key");
  if (queryKey || parts.some(([name]) => name === "api_key")) {
    url.searchParams.delete("api_key");
    url.hash = parts
      .filter(([name]) => name !== "api_key")
      .map(([, , raw]) => raw)
      .join("&");
    history.replaceState(history.state, "", url);
  }
  if (key) ui.apiKey.value = key;
  return {
    threads: url.searchParams.has("threads") ? Number.parseInt(url.searchParams.get("threads"), 10) || null : null,
    provider: url.searchParams.get("provider") ?? "auto",
    testHooks: parts.some(([name, value]) => name === "edge_test" && value === "1"),
    deferPlan: parts.some(([name, value]) => name === "load_plan" && value === "0"), // with the hook: reloadPlan loads it
    notice: queryKey
      ? "The API key in the address's query (?api_key=) is ignored: a query is sent to the server and kept in " +
        "its logs. Open the page as /edge/browser/#api_key=KEY or type the key in the field."
      : null,
  };
}

const address = readAddress();

const state = {
  plan: null, // the loaded plan, once its worker decodes with it
  planSeconds: null,
  worker: null,
  workerInfo: null,
  threads: address.threads, // WASM threads asked for (?threads=N, reloadPlan({threads})); null: the worker's default
  decoderOptions: { provider: address.provider, softwareAdapter: false, placement: false, sessionOptions: {} }, // init
  hardwareClass: HARDWARE_CLASS, // the class whose plan the page loads (the test hook may name another stateful one)
  handover: { handoverRtf: HANDOVER_RTF, loadHandoverRtf: HANDOVER_RTF }, // the bars (test hook: setHandover)
  planLoading: null, // Promise of the load in progress
  busy: false,
  cancel: null, // cancels the utterance in progress
  stopRequested: false,
  playback: null, // {context, node} or null when the browser gives no audio
  typed: null, // the TypedUtterance open or playing, while it is
  lastTyped: null, // the last TypedUtterance (its `done` gives the result)
  typedSaid: null, // the field's text the last one sent: the next one starts after it while the field does
  typedFailed: false, // the last one ended in an error: typing opens no session until Speak or the box is toggled
  notice: address.notice, // said with the first status after loading (a key in the query, ignored)
  capture: null, // the Capture of the utterance in progress (test hook only)
  framesReceived: 0, // since the page loaded: counts, not audio
  samplesDecoded: 0,
};

// -- status line --------------------------------------------------------------------------------------

function showStatus(message, { error = false } = {}) {
  ui.status.textContent = message;
  ui.status.classList.toggle("error", error);
}

function showNumbers({ firstAudioSeconds, rtf, bytes, planSeconds }) {
  const fixed = (value, digits) => (value === null || value === undefined ? "-" : value.toFixed(digits));
  ui.firstAudio.textContent = fixed(firstAudioSeconds, 3);
  ui.rtf.textContent = fixed(rtf, 3);
  ui.bytes.textContent = bytes === null || bytes === undefined ? "-" : bytes.toLocaleString("en-US");
  ui.planSeconds.textContent = fixed(planSeconds, 2);
}

function setSpeaking(speaking) {
  ui.speak.disabled = speaking && !(state.typed && !state.typed.ended); // Speak ends the text being typed
  ui.reloadPlan.disabled = speaking;
  ui.stop.disabled = !speaking;
}

const apiKey = () => ui.apiKey.value.trim();
const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// -- voices -------------------------------------------------------------------------------------------

async function loadVoices() {
  const response = await fetch(VOICES_PATH, { headers: authHeaders(), cache: "no-store" });
  if (!response.ok) {
    const reason = await serverMessage(response);
    throw new Error(
      response.status === 401 ? `the server refused the API key (401): ${reason}` : `voices: ${reason}`,
    );
  }
  const { voices = [] } = await response.json();
  const chosen = ui.voice.value;
  ui.voice.replaceChildren(new Option("(model default)", ""));
  for (const voice of voices) {
    const name = typeof voice === "string" ? voice : voice.name;
    if (typeof name === "string") ui.voice.add(new Option(name, name));
  }
  // "(model default)" only where the checkpoint lists no voice: a CustomVoice checkpoint has no default speaker
  if (chosen && [...ui.voice.options].some((option) => option.value === chosen)) ui.voice.value = chosen;
  else if (voices.length) ui.voice.selectedIndex = 1;
}

// -- the decoder worker -------------------------------------------------------------------------------

function startWorker() {
  const worker = new Worker(new URL("./decoder_worker.mjs", import.meta.url), { type: "module" });
  const pending = new Map();
  let next = 0;
  const failAll = (message) => {
    for (const { reject } of pending.values()) reject(new Error(message));
    pending.clear();
  };
  worker.onmessage = ({ data }) => {
    const call = pending.get(data.id);
    if (!call) return;
    pending.delete(data.id);
    if (data.ok) call.resolve(data);
    else call.reject(new Error(`the decoder failed: ${data.error}`));
  };
  worker.onerror = (event) => {
    event.preventDefault?.();
    failAll(`the decoder worker could not start or crashed: ${event.message || "see the console"}`);
  };
  return {
    call(type, fields = {}, transfer = []) {
      const id = next++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        worker.postMessage({ id, type, ...fields }, transfer);
      });
    },
    terminate() {
      worker.terminate();
      failAll("the decoder was restarted");
    },
  };
}

async function openCache() {
  try {
    return globalThis.caches ? await caches.open(CACHE_NAME) : null;
  } catch {
    return null; // an opaque origin or a private mode without Cache Storage: verify on every load
  }
}

/** What decodes: onnxruntime-web's provider, its adapter or threads, and why not WebGPU where it is WASM. */
function decoderSummary({ provider, adapter, threads, fallback }) {
  if (provider === "webgpu") {
    const name = [adapter?.vendor, adapter?.architecture].filter(Boolean).join(" ") || "an adapter";
    return `onnxruntime-web WebGPU (${name})`;
  }
  const isolation = crossOriginIsolated ? "" : " (not cross-origin isolated)";
  return `onnxruntime-web WASM, ${threads} thread(s)${isolation}${fallback ? `; ${fallback}` : ""}`;
}

/** Load the plan (Cache Storage, sha256 checked once) and a fresh decoder worker with it. */
async function reloadPlan() {
  if (state.planLoading) return state.planLoading;
  state.planLoading = (async () => {
    const started = performance.now();
    showStatus("Loading the browser plan...");
    const loaded = await loadPlan({
      baseUrl: location.origin,
      hardwareClass: state.hardwareClass,
      apiKey: apiKey() || null,
      cache: await openCache(),
    });
    const worker = startWorker();
    try {
      const artifacts = [...loaded.artifacts.entries()];
      const fields = { plan: loaded.plan, artifacts, threads: state.threads, ...state.decoderOptions };
      state.workerInfo = await worker.call("init", fields, artifacts.map(([, b]) => b));
    } catch (error) {
      worker.terminate();
      throw error;
    }
    state.worker?.terminate(); // the decoder of the previous plan keeps working until this one is ready
    state.worker = worker;
    state.plan = loaded.plan;
    state.planSeconds = (performance.now() - started) / 1000;
    const from = loaded.cached.length ? `${loaded.cached.length} file(s) from the cache` : "verified by sha256";
    ui.details.textContent = `plan ${loaded.plan.plan_id.slice(0, 12)} (${state.hardwareClass}), ${from}; ${decoderSummary(state.workerInfo)}`;
    showNumbers({ planSeconds: state.planSeconds });
    const { provider, adapter, fallback, threads, warmSeconds, placement } = state.workerInfo;
    return { planSeconds: state.planSeconds, cached: loaded.cached, error: null, provider, adapter, fallback, threads, warmSeconds, placement };
  })();
  try {
    return await state.planLoading;
  } finally {
    state.planLoading = null;
  }
}

// -- playback -----------------------------------------------------------------------------------------

async function ensurePlayback(sampleRate) {
  if (state.playback !== null) return state.playback;
  state.playback = false; // tried: a browser without Web Audio still decodes
  try {
    const context = new AudioContext({ sampleRate, latencyHint: "interactive" });
    await context.audioWorklet.addModule(new URL("./playback_worklet.mjs", import.meta.url));
    const node = new AudioWorkletNode(context, "edge-playback", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { jitterSamples: Math.round(JITTER_SECONDS * sampleRate) },
    });
    node.connect(context.destination);
    state.playback = { context, node };
  } catch (error) {
    console.warn("no audio playback:", error);
  }
  return state.playback;
}

function play(message, transfer = []) {
  if (state.playback) state.playback.node.port.postMessage(message, transfer);
}

// -- speaking -----------------------------------------------------------------------------------------

function closeMessage(event) {
  const reason = event.reason ? `: ${event.reason}` : "";
  return `the connection closed (code ${event.code}${reason}) before the stream's done message; the audio decoded so far is kept`;
}

/** Why a WebSocket failed before any message: asks the API so a wrong key says so. */
async function handshakeFailure(event) {
  try {
    const response = await fetch(VOICES_PATH, { headers: authHeaders(), cache: "no-store" });
    if (response.status === 401) return `the server refused the API key (401): ${await serverMessage(response)}`;
  } catch {
    return "the server cannot be reached";
  }
  return `the WebSocket was refused or closed at once (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`;
}

/**
 * What a test reads of an utterance (the test hook only): its first CAPTURE_FRAMES frames, the PCM decoded
 * from them, and the frames received at each segment end and reset among them. Once a frame is left out
 * (`complete` false) nothing more is kept, the PCM of the message holding that frame included: an utterance
 * holds at most CAPTURE_FRAMES frames and CAPTURE_FRAMES x samples-per-frame samples, however long it is.
 */
class Capture {
  constructor() {
    this.frames = [];
    this.pcm = [];
    this.segmentEnds = [];
    this.resets = [];
    this.complete = true;
  }

  addFrames(frames, count, q) {
    for (let t = 0; t < count; t++) {
      if (this.frames.length >= CAPTURE_FRAMES) {
        this.complete = false;
        return;
      }
      this.frames.push(Array.from(frames.subarray(t * q, (t + 1) * q)));
    }
  }

  addPcm(pcm) {
    if (this.complete) for (const sample of pcm) this.pcm.push(sample);
  }

  mark(list, received) {
    if (this.complete && list.length < CAPTURE_FRAMES) list.push(received);
  }
}

/**
 * Decode and play one codec stream, whatever carries it. `source.open(sink)` starts the stream and returns
 * `{cancel(), close()}`; the source hands every message (or piece of a recording) to
 * `sink.message(bytes, read)`, where `read(parser)` returns the events it completes, and reports the end of
 * its transport with `sink.ended(describe)`, `describe()` giving the Error for a stream that ended before
 * its done message. The parser, the decoder worker, the result and the status line are the same for both.
 */
async function runUtterance(
  source,
  {
    cancelAfterFrames = null,
    handoverRtf = state.handover.handoverRtf,
    loadHandoverRtf = state.handover.loadHandoverRtf,
  } = {},
) {
  const result = {
    frameCount: 0, // frames received
    sampleCount: 0, // samples played: decoded here, then (after a hand-over) by the server
    handover: null, // {fromFrame, rtf, serverSamples}: where the server's audio took over, and why
    firstAudioSeconds: null,
    rtf: null,
    bytes: 0,
    planSeconds: state.planSeconds,
    error: null,
    doneReason: null,
  };
  if (state.busy) return { ...result, error: "already speaking: Stop first" };
  // The test hook's capture: the frames and PCM, the frames received when a segment end or end of stream flushed
  // the decoder (segmentEnds) and when a reset flag dropped its state (resets), within CAPTURE_FRAMES.
  const capture = address.testHooks ? new Capture() : null;
  if (capture) {
    const { frames, pcm, segmentEnds, resets } = capture;
    Object.assign(result, { frames, pcm, segmentEnds, resets, captureComplete: true });
  }
  state.busy = true;
  state.capture = capture;
  state.stopRequested = false;
  setSpeaking(true);
  const started = performance.now();
  let decodeSeconds = 0;
  let decodedSamples = 0; // by the page: the RTF it measures
  let control = null;
  const received = () => result.frameCount;
  const addPcm = (pcm, seconds) => {
    decodeSeconds += seconds;
    if (!result.handover) decodedSamples += pcm.length;
    if (!pcm.length) return;
    if (result.firstAudioSeconds === null) result.firstAudioSeconds = (performance.now() - started) / 1000;
    result.sampleCount += pcm.length;
    state.samplesDecoded += pcm.length;
    capture?.addPcm(pcm);
    play({ type: "pcm", samples: pcm }, [pcm.buffer]); // the worklet drops what it played
  };
  const update = () => {
    const rate = state.plan?.sample_rate ?? 24000;
    result.rtf = decodedSamples ? decodeSeconds / (decodedSamples / rate) : null;
    showNumbers({ ...result, planSeconds: state.planSeconds });
  };
  try {
    if (!state.plan) await reloadPlan();
    const plan = state.plan;
    const worker = state.worker;
    result.planSeconds = state.planSeconds;
    await worker.call("reset");
    const playback = await ensurePlayback(plan.sample_rate);
    if (playback) {
      playback.context.resume().catch(() => {}); // autoplay rules may hold it until a click: decoding goes on
      play({ type: "start" });
    }
    showStatus(source.status);
    const parser = new CodecStreamParser();

    const samplesPerFrame = state.workerInfo.samplesPerFrame;
    /** The server's audio from the frame after those decoded here on; `measured`: where the speed comes from. */
    async function handOver(rtf, measured) {
      const fromFrame = decodedSamples / samplesPerFrame; // every frame decoded gave samplesPerFrame samples
      if (!control.serverAudio(fromFrame)) return; // the socket is closing: the page decodes on, as it can
      result.handover = { fromFrame, rtf, serverSamples: 0 };
      await worker.call("reset"); // frames it holds undecoded are the server's now
      showStatus(
        `Playing the server's audio from ${(decodedSamples / plan.sample_rate).toFixed(2)} s on: this device decodes at ` +
          `RTF ${rtf.toFixed(2)} (${measured}), too slow for real time.`,
      );
    }
    /** Too slow for real time over the utterance's frames decoded so far (at least MEASURE_FRAMES): the server's
     * audio from the next frame on. */
    async function handOverIfSlow() {
      if (result.handover || !control?.serverAudio || decodedSamples < MEASURE_FRAMES * samplesPerFrame) return;
      const rtf = decodeSeconds / (decodedSamples / plan.sample_rate);
      const frames = decodedSamples / samplesPerFrame;
      if (rtf > handoverRtf) await handOver(rtf, `over this utterance's first ${frames} frames`);
    }
    /** Every sample of the stream is here: the page's and, after a hand-over, the server's (a stream that was
     * cancelled or failed ends at its done, its audio as far as it came). */
    const audioComplete = () =>
      parser.done?.reason !== "complete" ||
      !result.handover || (result.handover.fromFrame * samplesPerFrame + result.handover.serverSamples) === result.frameCount * samplesPerFrame;

    async function handle(event) {
      if (event.type === "start") {
        checkStreamStart(event, plan);
        control?.started?.(event); // the server's limits: typed text waits for them
      } else if (event.type === "frames") {
        if (event.flags.reset) capture?.mark(capture.resets, received());
        capture?.addFrames(event.frames, event.count, event.numQuantizers);
        result.frameCount += event.count;
        state.framesReceived += event.count;
        if (!result.handover) {
          const reply = await worker.call("frames", { frames: event.frames, count: event.count, flags: event.flags }, [
            event.frames.buffer,
          ]);
          addPcm(reply.pcm, reply.seconds);
          await handOverIfSlow();
        }
        if (event.flags.segmentEnd || event.flags.endOfStream) capture?.mark(capture.segmentEnds, received());
        if (cancelAfterFrames !== null && received() >= cancelAfterFrames) control?.cancel();
      } else if (event.type === "pcm") {
        const expected = result.handover ? result.handover.fromFrame * samplesPerFrame + result.handover.serverSamples : null;
        if (event.firstSample !== expected) {
          throw new Error(
            expected === null
              ? "the server sent audio this page did not ask for"
              : `the server's audio starts at sample ${event.firstSample}, expected ${expected}: a gap or a repeat`,
          );
        }
        result.handover.serverSamples += event.samples.length;
        addPcm(event.samples, 0);
      } else if (event.type === "done") {
        result.doneReason = event.reason;
        if (event.reason === "error") result.error = `the server ended the stream with an error: ${event.error ?? "no message"}`;
      }
      update();
    }

    await new Promise((resolve, reject) => {
      let chain = Promise.resolve();
      let settled = false;
      const finish = (error) => {
        if (settled) return;
        settled = true;
        if (error) reject(error);
        else resolve();
      };
      control = source.open({
        received,
        message(bytes, read) {
          chain = chain.then(async () => {
            if (settled) return;
            result.bytes += bytes;
            let events;
            try {
              events = read(parser);
            } catch (error) {
              for (const event of error.events ?? []) await handle(event); // a recording's messages before the bad one
              throw error;
            }
            for (const event of events) await handle(event);
            if (parser.done !== null && audioComplete()) finish(); // a hand-over's last PCM may follow done
          });
          chain.catch(finish);
        },
        ended(describe) {
          chain.then(async () => {
            if (parser.done === null) return finish(await describe());
            if (audioComplete() || state.stopRequested) return finish(); // Stop: the audio as far as it came
            const { fromFrame, serverSamples } = result.handover;
            const want = (result.frameCount - fromFrame) * samplesPerFrame;
            const why = (await describe()).message;
            finish(new Error(`${serverSamples} of the server's ${want} samples came before ${why}`));
          }, finish);
        },
      });
      state.cancel = () => control.cancel();
      // Too slow already at load (its timed warm-up step): the whole utterance in the server's audio, at once (first
      // in the chain: the socket has given no message yet)
      if (control.serverAudio && state.workerInfo.warmRtf > loadHandoverRtf) {
        chain = chain.then(() => handOver(state.workerInfo.warmRtf, "measured at load"));
        chain.catch(finish);
      }
    });
  } catch (error) {
    const name = error instanceof CodecStreamError ? `the stream broke the protocol (${error.name}): ` : "";
    result.error = `${name}${error.message ?? error}`;
  } finally {
    control?.close();
    state.cancel = null;
    try {
      if (state.worker) {
        const reply = await state.worker.call("flush"); // the frames received are real: decode what is left
        addPcm(reply.pcm, reply.seconds);
      }
    } catch (error) {
      result.error ??= error.message;
    }
    play({ type: "end" });
    update();
    if (capture) result.captureComplete = capture.complete;
    if (result.handover) showNumbers({ ...result, planSeconds: state.planSeconds });
    state.capture = null;
    state.busy = false;
    setSpeaking(false);
  }
  const seconds = result.sampleCount / (state.plan?.sample_rate ?? 24000);
  const slow = result.handover && `(this device decodes at RTF ${result.handover.rtf.toFixed(2)}, too slow for real time)`;
  const until = (decodedSamples / (state.plan?.sample_rate ?? 24000)).toFixed(2);
  const where = !result.handover
    ? " decoded here"
    : result.handover.fromFrame
      ? `, decoded here up to ${until} s, then by the server ${slow}`
      : `, decoded by the server ${slow}`;
  if (result.error) showStatus(`Error: ${result.error}`, { error: true });
  else showStatus(`Done (${result.doneReason}): ${result.frameCount} frames, ${seconds.toFixed(2)} s of audio${where}.`);
  return result;
}

/**
 * The stream of `text` from the server's WebSocket, which the API key opens (a `bearer.` subprotocol); with
 * `typed` (a TypedUtterance) instead, a "text_mode": "stream" session whose text `typed` sends as it is typed.
 */
function socketSource(text, voice, typed = null) {
  return {
    status: typed ? "Speaking as you type: Speak or Enter ends the text..." : "Speaking...",
    open(sink) {
      if (typed ? typed.ended && !typed.hasText : !text.trim()) throw new Error("there is no text to speak");
      const protocols = [PROTOCOL, ...(apiKey() ? [`bearer.${base64url(apiKey())}`] : [])];
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const socket = new WebSocket(`${scheme}://${location.host}${SOCKET_PATH}`, protocols);
      socket.binaryType = "arraybuffer";
      let cancelSent = false;
      let messages = 0;
      let serverAudioFrom = null; // asked for before the socket opened: sent after the start
      const cancel = () => {
        if (!cancelSent && socket.readyState === WebSocket.OPEN) {
          socket.send(JSON.stringify({ type: "cancel" }));
          cancelSent = true;
        }
      };
      socket.onopen = () => {
        // server_audio: the session stays open after its done for a hand-over asked late (slow decoding lags)
        const request = { type: "start", edge_hardware: HARDWARE_CLASS, server_audio: true };
        if (typed) request.text_mode = "stream";
        else request.input = text;
        if (voice) request.voice = voice;
        socket.send(JSON.stringify(request));
        const send = (message) => socket.readyState === WebSocket.OPEN && socket.send(JSON.stringify(message));
        if (typed) typed.attach(send, sink); // typing may go on after the server closed: nothing is sent then
        else socket.send(JSON.stringify({ type: "end" }));
        if (serverAudioFrom !== null) socket.send(serverAudioRequest(serverAudioFrom));
        if (state.stopRequested) cancel();
      };
      socket.onmessage = ({ data }) => {
        messages += 1;
        if (typeof data === "string") {
          const bytes = new TextEncoder().encode(data).length;
          sink.message(bytes, (parser) => {
            const pcm = readPcmMessage(data, state.plan.sample_rate); // audio the server decodes, after a hand-over
            return [pcm ?? parser.handleText(data)];
          });
        } else {
          sink.message(data.byteLength, (parser) => [parser.handleBinary(new Uint8Array(data))].filter(Boolean));
        }
      };
      socket.onclose = (event) => {
        sink.ended(async () => new Error(messages ? closeMessage(event) : await handshakeFailure(event)));
      };
      return {
        cancel,
        /** The stream's start event: typed text is cut by the session's limits, as the server announced them. */
        started(start) {
          if (typed) typed.setLimits(sessionLimits(start));
        },
        /** Ask for the server's audio from `fromFrame` on; false where the socket is closing (nothing is sent). */
        serverAudio(fromFrame) {
          if (socket.readyState === WebSocket.OPEN) socket.send(serverAudioRequest(fromFrame));
          else if (socket.readyState === WebSocket.CONNECTING) serverAudioFrom = fromFrame;
          else return false;
          return true;
        },
        close() {
          if (socket.readyState <= WebSocket.OPEN) socket.close(1000);
        },
      };
    },
  };
}

/**
 * A recorded stream (the "QCS\x01" framing of vllm_omni.edge.stream.recording), fed in pieces as an HTTP body
 * arrives. It is queued whole at once, so Stop has nothing left to cancel.
 */
function recordingSource(bytes) {
  return {
    status: "Playing a recording...",
    open(sink) {
      for (let offset = 0; offset < bytes.length; offset += RECORDING_PIECE_BYTES) {
        const piece = bytes.subarray(offset, offset + RECORDING_PIECE_BYTES);
        sink.message(piece.length, (parser) => parser.feedRecording(piece));
      }
      sink.message(0, (parser) => parser.finishRecording()); // a cut-off recording throws TruncatedStreamError
      return { cancel() {}, close() {} };
    },
  };
}

const speak = (text, { voice, cancelAfterFrames = null, handoverRtf, loadHandoverRtf } = {}) =>
  runUtterance(socketSource(text, voice), { cancelAfterFrames, handoverRtf, loadHandoverRtf });

function stop() {
  state.stopRequested = true;
  if (state.typed) {
    state.typed.ended = true; // nothing more is sent: the session is cancelled
    setSpeaking(state.busy);
  }
  state.cancel?.();
  play({ type: "stop" });
}

// -- streaming as typed -------------------------------------------------------------------------------

/** Where the word at the end of `value` starts (value.length when it ends in a space or punctuation). */
function wordStart(value) {
  let end = value.length;
  while (end > 0) {
    const pair = end >= 2 && /[\uDC00-\uDFFF]/.test(value[end - 1]) && /[\uD800-\uDBFF]/.test(value[end - 2]);
    const start = pair ? end - 2 : end - 1;
    if (!WORD_CHAR.test(value.slice(start, end))) break;
    end = start;
  }
  return end;
}

/**
 * One utterance streamed as the field is typed. `said` is the field's text taken as sent: each edit that
 * extends it sends the characters it added up to the end of the last whole word (the word being typed follows
 * once a space or punctuation ends it, or at `end`; the server's tokenizer waits for that anyway), so fixing a
 * typo in that word is free. An edit of text already sent (a deletion or change before it, a replaced
 * selection) cannot be unsaid: it is not spoken, `said` becomes the edited field up to its last whole word,
 * and typing after it goes on being sent. Messages wait in `outbox` until the socket is open and the server has
 * announced its limits (its start message): text goes out in the pieces they allow (textPieces).
 */
class TypedUtterance {
  constructor(said = "") {
    this.said = said;
    this.hasText = false; // text was given to be sent
    this.pieces = address.testHooks ? [] : null; // the text pieces sent, in order (for the test hook)
    this.ended = false; // `end` (or Stop): nothing more is sent
    this.framesAtEnd = null;
    this.outbox = [];
    this.send = null;
    this.limits = null;
    this.sink = null;
    this.done = null; // Promise of the result, as speak's plus {textPieces, framesAtEnd}
    this.result = null; // that result, once it is there
  }

  attach(send, sink) {
    this.send = send;
    this.sink = sink;
    this.flush();
  }

  /** The session's limits, from the server's start message: what waited for them goes out. */
  setLimits(limits) {
    this.limits = limits;
    this.flush();
  }

  post(message) {
    this.outbox.push(message);
    this.flush();
  }

  flush() {
    if (!this.send) return;
    if (!this.limits) {
      // a cancel goes at once (the server takes it at any time); what waited with it is moot
      const cancel = this.outbox.find((message) => message.type === "cancel");
      if (cancel) {
        this.outbox = [];
        this.send(cancel);
      }
      return;
    }
    for (const message of this.outbox.splice(0)) {
      if (message.type !== "text") {
        this.send(message);
        continue;
      }
      for (const piece of textPieces(message.text, this.limits)) {
        this.pieces?.push(piece);
        this.send({ type: "text", text: piece });
      }
    }
  }

  /** The field is now `value`; `final`: its last word too. */
  update(value, { final = false } = {}) {
    if (this.ended) return;
    if (!value.startsWith(this.said)) this.said = value.slice(0, wordStart(value)); // an edit of sent text
    const upTo = final ? value.length : wordStart(value);
    if (upTo <= this.said.length) return;
    const text = value.slice(this.said.length, upTo);
    this.said = value.slice(0, upTo);
    this.hasText = true;
    this.post({ type: "text", text });
  }

  /** Send the rest of `value` and `end` (`cancel` when no text was ever given: there is nothing to speak). */
  end(value) {
    if (this.ended) return;
    this.update(value, { final: true });
    this.ended = true;
    this.framesAtEnd = this.sink?.received() ?? 0;
    this.post({ type: this.hasText ? "end" : "cancel" });
  }
}

/** Open a streamed utterance with the field's text after `said` (the part already spoken, kept as sent). */
function startTyped(value, said = "") {
  said += /^\s*/.exec(value.slice(said.length))[0]; // no leading whitespace
  const typed = new TypedUtterance(said);
  state.typed = state.lastTyped = typed;
  typed.update(value);
  typed.done = runUtterance(socketSource(null, ui.voice.value || undefined, typed)).then((result) => {
    typed.ended = true;
    if (state.typed === typed) state.typed = null;
    state.typedFailed = Boolean(result.error); // else every keystroke would open a session failing the same way
    if (!result.error) state.typedSaid = typed.said;
    typed.result = { ...result, textPieces: typed.pieces, framesAtEnd: typed.framesAtEnd };
    return typed.result;
  });
  return typed;
}

function onTextInput(event) {
  if (!ui.streamTyped.checked || event.isComposing) return; // an IME's composition is sent once it commits
  const value = ui.text.value;
  if (state.typed) {
    state.typed.update(value);
    return;
  }
  const after = state.typedSaid !== null && value.startsWith(state.typedSaid) ? state.typedSaid : "";
  if (state.busy || state.typedFailed || !value.slice(after.length).trim()) return; // busy, failed, nothing to say
  startTyped(value, after);
}

function endTyped() {
  const typed = state.typed;
  if (!typed || typed.ended) return;
  typed.end(ui.text.value);
  setSpeaking(state.busy);
}

function onSpeak() {
  state.typedFailed = false;
  if (state.typed && !state.typed.ended) endTyped();
  else if (!ui.streamTyped.checked) speak(ui.text.value, { voice: ui.voice.value || undefined });
  else if (!state.busy) {
    startTyped(ui.text.value); // the whole field, streamed
    endTyped();
  }
}

// -- wiring -------------------------------------------------------------------------------------------

async function refreshVoicesAndPlan() {
  const errors = [];
  try {
    await loadVoices();
  } catch (error) {
    errors.push(error.message);
  }
  try {
    if (!(address.testHooks && address.deferPlan && !state.worker)) await reloadPlan();
  } catch (error) {
    errors.push(error.message);
  }
  const notice = state.notice ? `\n${state.notice}` : ""; // #status keeps line breaks
  state.notice = null; // said once
  if (errors.length) showStatus(`Error: ${errors.join("; ")}${notice}`, { error: true });
  else showStatus(`Ready.${notice}`);
  return errors;
}

ui.speak.addEventListener("click", onSpeak);
ui.stop.addEventListener("click", stop);
ui.text.addEventListener("input", onTextInput);
ui.text.addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || event.shiftKey || event.isComposing || !ui.streamTyped.checked) return;
  event.preventDefault(); // with the box on, Enter is Speak (Shift+Enter a new line)
  if (!ui.speak.disabled) onSpeak();
});
ui.streamTyped.addEventListener("change", () => {
  state.typedSaid = null;
  state.typedFailed = false;
  if (!ui.streamTyped.checked) endTyped(); // the text typed so far is spoken to its end
});
ui.reloadPlan.addEventListener("click", async () => {
  ui.reloadPlan.disabled = true;
  ui.speak.disabled = true;
  try {
    await refreshVoicesAndPlan();
  } finally {
    setSpeaking(false);
  }
});
ui.apiKey.addEventListener("change", () => loadVoices().catch((error) => showStatus(`Error: ${error.message}`, { error: true })));

const ready = refreshVoicesAndPlan().then(() => undefined);

/** The frames and samples the page holds: the utterance in progress and the last typed result (test hook). */
function heldAudio() {
  const held = [state.capture, state.lastTyped?.result].filter(Boolean);
  return {
    frames: held.reduce((sum, { frames }) => sum + (frames?.length ?? 0), 0),
    samples: held.reduce((sum, { pcm }) => sum + (pcm?.length ?? 0), 0),
  };
}

if (address.testHooks) {
  window.edgeTest = {
    ready,
    speak,
    playRecording: (bytes) => runUtterance(recordingSource(Uint8Array.from(bytes))),
    typedResult: async () => (state.lastTyped ? await state.lastTyped.done : null),
    setHandover({ handoverRtf = HANDOVER_RTF, loadHandoverRtf = HANDOVER_RTF } = {}) {
      state.handover = { handoverRtf, loadHandoverRtf };
    },
    async setApiKey(key) {
      ui.apiKey.value = key ?? "";
      try {
        await loadVoices();
        if (ui.status.classList.contains("error")) showStatus("Ready.");
      } catch (error) {
        showStatus(`Error: ${error.message}`, { error: true });
      }
    },
    async reloadPlan({ threads, provider, softwareAdapter, placement, sessionOptions, hardwareClass } = {}) {
      if (threads !== undefined) state.threads = threads;
      state.hardwareClass = hardwareClass ?? HARDWARE_CLASS;
      const options = state.decoderOptions;
      state.decoderOptions = {
        provider: provider ?? options.provider,
        softwareAdapter: softwareAdapter ?? options.softwareAdapter,
        placement: placement ?? false,
        sessionOptions: sessionOptions ?? {},
      };
      try {
        const loaded = await reloadPlan();
        showStatus("Ready.");
        return loaded;
      } catch (error) {
        showStatus(`Error: ${error.message}`, { error: true });
        return { planSeconds: null, error: error.message };
      } finally {
        if (!state.busy) setSpeaking(false);
      }
    },
    memory: () => ({
      ...heldAudio(),
      framesReceived: state.framesReceived,
      samplesDecoded: state.samplesDecoded,
      captureFrames: CAPTURE_FRAMES,
      samplesPerFrame: state.workerInfo?.samplesPerFrame ?? null,
    }),
  };
}
