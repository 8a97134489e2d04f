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
// window.edgeTest (the test hook the Python browser test drives):
//   ready: Promise<void>        the first plan load and voice list were attempted (errors are in #status)
//   speak(text, {voice, cancelAfterFrames}) -> {frames, pcm, firstAudioSeconds, rtf, bytes, planSeconds, error,
//        doneReason, segmentEnds, resets}
//   playRecording(bytes: number[]) -> as speak: a codec-stream recording ("QCS\x01" framing) through the same
//        parser, decoder worker and status line as the WebSocket's messages (hostile and cut-off streams)
//   setApiKey(key), reloadPlan({threads}) -> {planSeconds, threads, cached, error}   (threads: as ?threads=N)
//   typedResult() -> as speak, plus {textPieces, framesAtEnd}, of the last utterance streamed as typed (null:
//        none yet), once it is over: the pieces sent, and the frames received when `end` was sent

import { loadPlan } from "./edge/plan.mjs";
import { CodecStreamError, CodecStreamParser } from "./edge/stream.mjs";

const HARDWARE_CLASS = "browser";
const SUBPROTOCOL = "qwen3-tts-codec-stream";
const CACHE_NAME = "vllm-omni-edge-plans";
const JITTER_SECONDS = 0.2;
const RECORDING_PIECE_BYTES = 4096;
const MAX_PIECE_CHARS = 4096; // the server's default piece limit (--speech-max-input-chars): longer pastes split
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

const state = {
  plan: null, // the loaded plan, once its worker decodes with it
  planSeconds: null,
  worker: null,
  workerInfo: null,
  threads: null, // WASM threads asked for (?threads=N or reloadPlan({threads})); null: the worker's default
  planLoading: null, // Promise of the load in progress
  busy: false,
  cancel: null, // cancels the utterance in progress
  stopRequested: false,
  playback: null, // {context, node} or null when the browser gives no audio
  typed: null, // the TypedUtterance open or playing, while it is
  lastTyped: null, // the last TypedUtterance (its `done` gives the result)
  typedSaid: null, // the field's text the last one sent: the next one starts after it while the field does
  typedFailed: false, // the last one ended in an error: typing opens no session until Speak or the box is toggled
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

/** A one-line reason from an OpenAI-style error body. */
async function serverMessage(response) {
  try {
    const body = await response.json();
    return body?.error?.message ?? body?.detail ?? `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// -- voices -------------------------------------------------------------------------------------------

async function loadVoices() {
  const response = await fetch("/v1/audio/voices", { headers: authHeaders(), cache: "no-store" });
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

/** Load the plan (Cache Storage, sha256 checked once) and a fresh decoder worker with it. */
async function reloadPlan() {
  if (state.planLoading) return state.planLoading;
  state.planLoading = (async () => {
    const started = performance.now();
    showStatus("Loading the browser plan...");
    const loaded = await loadPlan({
      baseUrl: location.origin,
      hardwareClass: HARDWARE_CLASS,
      apiKey: apiKey() || null,
      cache: await openCache(),
    });
    const worker = startWorker();
    try {
      const artifacts = [...loaded.artifacts.entries()];
      const fields = { plan: loaded.plan, artifacts, threads: state.threads };
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
    ui.details.textContent =
      `plan ${loaded.plan.plan_id.slice(0, 12)} (${HARDWARE_CLASS}), ${from}; onnxruntime-web WASM, ` +
      `${state.workerInfo.threads} thread(s)${crossOriginIsolated ? "" : " (not cross-origin isolated)"}`;
    showNumbers({ planSeconds: state.planSeconds });
    return { planSeconds: state.planSeconds, threads: state.workerInfo.threads, cached: loaded.cached, error: null };
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
    const response = await fetch("/v1/audio/voices", { headers: authHeaders(), cache: "no-store" });
    if (response.status === 401) return `the server refused the API key (401): ${await serverMessage(response)}`;
  } catch {
    return "the server cannot be reached";
  }
  return `the WebSocket was refused or closed at once (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`;
}

function checkStart(start, plan) {
  if (start.plan_id && start.plan_id !== plan.plan_id) {
    throw new Error(
      `the stream was made for plan ${start.plan_id.slice(0, 12)}, this page loaded ${plan.plan_id.slice(0, 12)}: reload the plan`,
    );
  }
  for (const key of ["num_quantizers", "codebook_size", "sample_rate"]) {
    if (start[key] !== plan[key]) {
      throw new Error(`the stream's ${key} is ${start[key]}, the plan's ${plan[key]}: they do not belong together`);
    }
  }
}

/**
 * Decode and play one codec stream, whatever carries it. `source.open(sink)` starts the stream and returns
 * `{cancel(), close()}`; the source hands every message (or piece of a recording) to
 * `sink.message(bytes, read)`, where `read(parser)` returns the events it completes, and reports the end of
 * its transport with `sink.ended(describe)`, `describe()` giving the Error for a stream that ended before
 * its done message. The parser, the decoder worker, the result and the status line are the same for both.
 */
async function runUtterance(source, { cancelAfterFrames = null } = {}) {
  const result = {
    frames: [],
    pcm: [],
    firstAudioSeconds: null,
    rtf: null,
    bytes: 0,
    planSeconds: state.planSeconds,
    error: null,
    doneReason: null,
    segmentEnds: [], // frames received when a segment end or end of stream flushed the decoder
    resets: [], // frames received when a reset flag dropped the decoder's state
  };
  if (state.busy) return { ...result, error: "already speaking: Stop first" };
  state.busy = true;
  state.stopRequested = false;
  setSpeaking(true);
  const started = performance.now();
  let decodeSeconds = 0;
  let samples = 0;
  let control = null;
  const received = () => result.frames.length;
  const addPcm = (pcm, seconds) => {
    decodeSeconds += seconds;
    if (!pcm.length) return;
    if (result.firstAudioSeconds === null) result.firstAudioSeconds = (performance.now() - started) / 1000;
    samples += pcm.length;
    for (const sample of pcm) result.pcm.push(sample);
    play({ type: "pcm", samples: pcm }, [pcm.buffer]);
  };
  const update = () => {
    const rate = state.plan?.sample_rate ?? 24000;
    result.rtf = samples ? decodeSeconds / (samples / rate) : null;
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

    async function handle(event) {
      if (event.type === "start") {
        checkStart(event, plan);
      } else if (event.type === "frames") {
        const q = event.numQuantizers;
        if (event.flags.reset) result.resets.push(received());
        for (let t = 0; t < event.count; t++) result.frames.push(Array.from(event.frames.subarray(t * q, (t + 1) * q)));
        const reply = await worker.call("frames", { frames: event.frames, count: event.count, flags: event.flags }, [
          event.frames.buffer,
        ]);
        if (event.flags.segmentEnd || event.flags.endOfStream) result.segmentEnds.push(received());
        addPcm(reply.pcm, reply.seconds);
        if (cancelAfterFrames !== null && received() >= cancelAfterFrames) control?.cancel();
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
            if (parser.done !== null) finish();
          });
          chain.catch(finish);
        },
        ended(describe) {
          chain.then(async () => (parser.done !== null ? finish() : finish(await describe())), finish);
        },
      });
      state.cancel = () => control.cancel();
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
    state.busy = false;
    setSpeaking(false);
  }
  const seconds = samples / (state.plan?.sample_rate ?? 24000);
  if (result.error) showStatus(`Error: ${result.error}`, { error: true });
  else showStatus(`Done (${result.doneReason}): ${result.frames.length} frames, ${seconds.toFixed(2)} s of audio decoded here.`);
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
      if (typed ? typed.ended && !typed.pieces.length : !text.trim()) throw new Error("there is no text to speak");
      const protocols = [SUBPROTOCOL, ...(apiKey() ? [`bearer.${base64url(apiKey())}`] : [])];
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const socket = new WebSocket(`${scheme}://${location.host}/v1/audio/speech/stream`, protocols);
      socket.binaryType = "arraybuffer";
      let cancelSent = false;
      let messages = 0;
      const cancel = () => {
        if (!cancelSent && socket.readyState === WebSocket.OPEN) {
          socket.send(JSON.stringify({ type: "cancel" }));
          cancelSent = true;
        }
      };
      socket.onopen = () => {
        const request = { type: "start", edge_hardware: HARDWARE_CLASS };
        if (typed) request.text_mode = "stream";
        else request.input = text;
        if (voice) request.voice = voice;
        socket.send(JSON.stringify(request));
        const send = (message) => socket.readyState === WebSocket.OPEN && socket.send(JSON.stringify(message));
        if (typed) typed.attach(send, sink); // typing may go on after the server closed: nothing is sent then
        else socket.send(JSON.stringify({ type: "end" }));
        if (state.stopRequested) cancel();
      };
      socket.onmessage = ({ data }) => {
        messages += 1;
        if (typeof data === "string") {
          sink.message(new TextEncoder().encode(data).length, (parser) => [parser.handleText(data)]);
        } else {
          sink.message(data.byteLength, (parser) => [parser.handleBinary(new Uint8Array(data))].filter(Boolean));
        }
      };
      socket.onclose = (event) => {
        sink.ended(async () => new Error(messages ? closeMessage(event) : await handshakeFailure(event)));
      };
      return {
        cancel,
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

const speak = (text, { voice, cancelAfterFrames = null } = {}) =>
  runUtterance(socketSource(text, voice), { cancelAfterFrames });

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
 * and typing after it goes on being sent. Messages wait in `outbox` until the socket is open.
 */
class TypedUtterance {
  constructor(said = "") {
    this.said = said;
    this.pieces = []; // the text pieces sent, in order
    this.ended = false; // `end` (or Stop): nothing more is sent
    this.framesAtEnd = null;
    this.outbox = [];
    this.send = null;
    this.sink = null;
    this.done = null; // Promise of the result, as speak's plus {textPieces, framesAtEnd}
  }

  attach(send, sink) {
    this.send = send;
    this.sink = sink;
    for (const message of this.outbox.splice(0)) send(message);
  }

  post(message) {
    if (this.send) this.send(message);
    else this.outbox.push(message);
  }

  /** The field is now `value`; `final`: its last word too. */
  update(value, { final = false } = {}) {
    if (this.ended) return;
    if (!value.startsWith(this.said)) this.said = value.slice(0, wordStart(value)); // an edit of sent text
    const upTo = final ? value.length : wordStart(value);
    if (upTo <= this.said.length) return;
    const points = Array.from(value.slice(this.said.length, upTo));
    this.said = value.slice(0, upTo);
    for (let i = 0; i < points.length; i += MAX_PIECE_CHARS) {
      const piece = points.slice(i, i + MAX_PIECE_CHARS).join("");
      this.pieces.push(piece);
      this.post({ type: "text", text: piece });
    }
  }

  /** Send the rest of `value` and `end` (`cancel` when no text was ever sent: there is nothing to speak). */
  end(value) {
    if (this.ended) return;
    this.update(value, { final: true });
    this.ended = true;
    this.framesAtEnd = this.sink?.received() ?? 0;
    this.post({ type: this.pieces.length ? "end" : "cancel" });
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
    return { ...result, textPieces: typed.pieces, framesAtEnd: typed.framesAtEnd };
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
    await reloadPlan();
  } catch (error) {
    errors.push(error.message);
  }
  if (errors.length) showStatus(`Error: ${errors.join("; ")}`, { error: true });
  else showStatus("Ready.");
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

// A key given in the page's address (`?api_key=KEY`) fills the field, then leaves the address bar and history.
const query = new URLSearchParams(location.search);
if (query.has("threads")) state.threads = Number.parseInt(query.get("threads"), 10) || null;
const givenKey = query.get("api_key");
if (givenKey) {
  ui.apiKey.value = givenKey;
  const address = new URL(location.href);
  address.searchParams.delete("api_key");
  history.replaceState(null, "", address);
}

const ready = refreshVoicesAndPlan().then(() => undefined);

window.edgeTest = {
  ready,
  speak,
  playRecording: (bytes) => runUtterance(recordingSource(Uint8Array.from(bytes))),
  typedResult: async () => (state.lastTyped ? await state.lastTyped.done : null),
  async setApiKey(key) {
    ui.apiKey.value = key ?? "";
    try {
      await loadVoices();
      if (ui.status.classList.contains("error")) showStatus("Ready.");
    } catch (error) {
      showStatus(`Error: ${error.message}`, { error: true });
    }
  },
  async reloadPlan({ threads } = {}) {
    if (threads !== undefined) state.threads = threads;
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
};
