// The codec-token stream, read in JavaScript: byte-compatible with vllm_omni/edge/stream/ (protocol version 1).
//
// Messages (docs/serving/codec_stream.md): a JSON start message, binary frames messages (a 12-byte
// little-endian header, then T x Q codes, frame-major, int16 or 11-bit packed), a JSON done message.
// On a byte stream (a recording, an HTTP body) each message is framed as a kind byte (J/B), a u32 length
// and the payload, after the magic "QCS\x01". Every length is checked against a limit before anything is
// allocated, and a message that throws leaves the parser's protocol state as it was. The errors are the
// Python parser's classes (the same class for the same fault), in this page's words; the Node tests check the
// events and the classes against recordings and hostile inputs made by the Python encoder and parser.

import { isWrittenInteger, jsonType, readJson, shown, shownAt } from "./json_text.mjs";

/** The protocol's name, in its start message; also the WebSocket subprotocol the page offers. */
export const PROTOCOL = "qwen3-tts-codec-stream";
/** The server's WebSocket route that carries the stream (text in pieces, frames back). */
export const SOCKET_PATH = "/v1/audio/speech/stream";
export const PROTOCOL_VERSION = 1;
export const HEADER_BYTES = 12;
export const FLAG_END_OF_STREAM = 0x01;
export const FLAG_SEGMENT_END = 0x02;
export const FLAG_RESET = 0x04;
export const KNOWN_FLAGS = FLAG_END_OF_STREAM | FLAG_SEGMENT_END | FLAG_RESET;
export const PACKINGS = ["int16", "packed11"];
export const RECORDING_MAGIC = Uint8Array.of(0x51, 0x43, 0x53, 0x01); // "QCS\x01"
export const KIND_JSON = 0x4a; // "J"
export const KIND_BINARY = 0x42; // "B"
export const RECORD_HEADER_BYTES = 5;
export const MAX_MESSAGE_BYTES = 1 << 20;
export const MAX_FRAMES_PER_MESSAGE = 4096;
export const DONE_REASONS = ["complete", "cancelled", "error"];

// -- errors: one class per way a message or stream breaks the protocol (vllm_omni/edge/stream/errors.py) --

export class CodecStreamError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}
/** Not JSON, wrong type, missing or mistyped fields, a message out of order. */
export class MalformedMessageError extends CodecStreamError {}
/** A protocol version this parser does not speak. */
export class BadVersionError extends CodecStreamError {}
/** A message shorter than its header says. */
export class TruncatedMessageError extends CodecStreamError {}
/** A message longer than its header says, or than the limits allow. */
export class OversizedMessageError extends CodecStreamError {}
/** A frame count over the stream's max_frames_per_message. */
export class TooManyFramesError extends CodecStreamError {}
/** A code outside 0 .. codebook_size - 1. */
export class CodesOutOfRangeError extends CodecStreamError {}
/** Messages are missing: the sequence number jumped. */
export class SequenceGapError extends CodecStreamError {}
/** A sequence number already seen (a retransmission); the message is ignored. */
export class DuplicateMessageError extends CodecStreamError {}
/** Frames after the end-of-stream flag or the done message. */
export class FramesAfterEndError extends CodecStreamError {}
/** The byte stream ended inside a message, or before the done message. */
export class TruncatedStreamError extends CodecStreamError {}

export const ERROR_CLASSES = {
  CodecStreamError,
  MalformedMessageError,
  BadVersionError,
  TruncatedMessageError,
  OversizedMessageError,
  TooManyFramesError,
  CodesOutOfRangeError,
  SequenceGapError,
  DuplicateMessageError,
  FramesAfterEndError,
  TruncatedStreamError,
};

// -- packing -----------------------------------------------------------------------------------------

/** `count` 11-bit fields, least significant bit first, from `bytes` (which holds at least ceil(11 count / 8)). */
export function unpack11(bytes, count) {
  const codes = new Int32Array(count);
  let accumulator = 0;
  let bits = 0;
  let offset = 0;
  for (let i = 0; i < count; i++) {
    while (bits < 11) {
      accumulator |= bytes[offset++] << bits;
      bits += 8;
    }
    codes[i] = accumulator & 0x7ff;
    accumulator >>>= 11;
    bits -= 11;
  }
  return codes;
}

/** Codes (each < 2048) as 11-bit fields, least significant bit first, zero-padded to a whole byte. */
export function pack11(codes) {
  const out = new Uint8Array((11 * codes.length + 7) >> 3);
  let accumulator = 0;
  let bits = 0;
  let offset = 0;
  for (const code of codes) {
    accumulator |= (code & 0x7ff) << bits;
    bits += 11;
    while (bits >= 8) {
      out[offset++] = accumulator & 0xff;
      accumulator >>>= 8;
      bits -= 8;
    }
  }
  if (bits) out[offset] = accumulator & 0xff;
  return out;
}

// -- message fields ------------------------------------------------------------------------------------

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
// What a field may be: an integer written as one (`16.0` is refused, as the server's reader refuses it), any
// number, a string, an object.
const KINDS = {
  "an integer": isWrittenInteger,
  "a number": (row, name) => typeof row[name] === "number",
  "a string": (row, name) => typeof row[name] === "string",
  "a JSON object": (row, name) => isObject(row[name]),
};

/** `row[name]` checked as the protocol types it: a missing or null optional field is null. */
function messageField(row, name, kind, optional = false) {
  const value = Object.hasOwn(row, name) ? row[name] : null;
  if (value === null && optional) return null;
  if (value === null || !KINDS[kind](row, name)) {
    throw new MalformedMessageError(`${row.type}: ${name} must be ${kind}, found ${shownAt(row, name)}`);
  }
  return value;
}

/** The start message's contract, checked as the server's StreamStart.from_json + check() check it; returns the
 * event with the fields StreamStart.to_json() writes. */
function readStart(row) {
  if (row.protocol !== PROTOCOL) {
    throw new MalformedMessageError(`start: protocol ${shown(row.protocol ?? null)}, expected ${shown(PROTOCOL)}`);
  }
  const version = Object.hasOwn(row, "version") ? row.version : null;
  if (!(version === PROTOCOL_VERSION || version === true)) {
    // the server's reader compares the version by value, where true and 1.0 equal 1: so does this one
    throw new BadVersionError(`start: protocol version ${shown(version)}; this page speaks ${PROTOCOL_VERSION}`);
  }
  const start = {
    num_quantizers: messageField(row, "num_quantizers", "an integer"),
    codebook_size: messageField(row, "codebook_size", "an integer"),
    frame_rate: messageField(row, "frame_rate", "a number"),
    sample_rate: messageField(row, "sample_rate", "an integer"),
    packing: messageField(row, "packing", "a string"),
    max_frames_per_message: messageField(row, "max_frames_per_message", "an integer"),
    hardware_class: messageField(row, "hardware_class", "a string", true),
    plan_id: messageField(row, "plan_id", "a string", true),
    plan: messageField(row, "plan", "a JSON object", true),
    stream_id: messageField(row, "stream_id", "a string", true),
    limits: messageField(row, "limits", "a JSON object", true), // a WebSocket session's (./session_limits.mjs)
    version: PROTOCOL_VERSION,
  };
  checkStart(start);
  const event = { type: "start", protocol: PROTOCOL };
  for (const [key, value] of Object.entries(start)) if (value !== null) event[key] = value;
  return event;
}

function checkStart(start) {
  const { num_quantizers: q, codebook_size: size, packing, max_frames_per_message: most } = start;
  if (!(q >= 1 && q <= 64)) throw new MalformedMessageError(`start: num_quantizers ${q} is outside 1..64`);
  if (!(size >= 2 && size <= 32768)) {
    throw new MalformedMessageError(`start: codebook_size ${size} is outside 2..32768 (int16 codes)`);
  }
  if (!PACKINGS.includes(packing)) {
    throw new MalformedMessageError(`start: packing ${shown(packing)}; known: ${PACKINGS.join(", ")}`);
  }
  if (packing === "packed11" && size > 2048) {
    throw new MalformedMessageError(`start: packed11 holds codes < 2048, codebook_size is ${size}`);
  }
  if (!(most >= 1 && most <= MAX_FRAMES_PER_MESSAGE)) {
    throw new MalformedMessageError(
      `start: max_frames_per_message ${most} is outside 1..${MAX_FRAMES_PER_MESSAGE}`,
    );
  }
  if (!(start.frame_rate > 0 && Number.isFinite(start.frame_rate)) || start.sample_rate < 1) {
    throw new MalformedMessageError(
      `start: frame_rate ${start.frame_rate} must be a finite number > 0 and sample_rate ${start.sample_rate} >= 1`,
    );
  }
}

/** Bytes of the codes of `count` frames in the stream's packing. */
export function payloadBytes(start, count) {
  const codes = count * start.num_quantizers;
  return start.packing === "int16" ? 2 * codes : Math.floor((11 * codes + 7) / 8);
}

const utf8 = new TextDecoder("utf-8", { fatal: true });
const asBytes = (data) =>
  data instanceof Uint8Array ? data : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : new Uint8Array(data);

function codePoints(text, atLeast) {
  if (text.length <= atLeast) return text.length; // UTF-16 units >= code points
  let count = 0;
  for (const _ of text) count++;
  return count;
}

// -- the parser ----------------------------------------------------------------------------------------

/**
 * Turns messages into events, checking each against the protocol and the stream so far.
 *
 * Events: `{type: "start", ...}` (the start message's fields, as Python's StreamStart.to_json()),
 * `{type: "frames", frames: Int32Array [count x Q], count, numQuantizers, flags: {endOfStream, segmentEnd,
 * reset}, flagBits, seq, firstFrame}` and `{type: "done", total_frames, last_seq, reason, error}`.
 * A message that throws leaves the state as it was.
 */
export class CodecStreamParser {
  constructor({ maxMessageBytes = MAX_MESSAGE_BYTES } = {}) {
    this.maxMessageBytes = maxMessageBytes;
    this.start = null;
    this.nextSeq = 0;
    this.framesReceived = 0;
    this.ended = false; // end-of-stream flag seen
    this.done = null;
    this.duplicates = 0;
    this.messages = 0;
    this.bytes = 0;
    this._record = { phase: "magic", header: new Uint8Array(RECORD_HEADER_BYTES), filled: 0, kind: 0, payload: null };
  }

  // -- WebSocket messages (text frames: JSON, binary frames: frames messages) ---------------------------

  /** One WebSocket text message. */
  handleText(text) {
    const event = this.parseJson(text);
    this.messages++;
    this.bytes += new TextEncoder().encode(text).length;
    return event;
  }

  /** One WebSocket binary message; a duplicate (a retransmission) is counted and skipped: null. */
  handleBinary(data) {
    const bytes = asBytes(data);
    try {
      const event = this.parseFrames(bytes);
      this.messages++;
      this.bytes += bytes.length;
      return event;
    } catch (error) {
      if (!(error instanceof DuplicateMessageError)) throw error;
      this.duplicates++;
      return null;
    }
  }

  /** A message of kind "J"/"B" (0x4a/0x42, or the letter); duplicates throw, as in Python's parse(). */
  parse(kind, payload) {
    const code = typeof kind === "string" ? kind.charCodeAt(0) : kind;
    if (code === KIND_JSON) return this.parseJson(payload);
    if (code === KIND_BINARY) return this.parseFrames(payload);
    throw new MalformedMessageError(`message kind ${byteText([code])}; expected "J" (JSON) or "B" (frames)`);
  }

  /** A start or done message: a string (a WebSocket text frame) or UTF-8 bytes. */
  parseJson(payload) {
    const size = typeof payload === "string" ? codePoints(payload, this.maxMessageBytes) : asBytes(payload).length;
    if (size > this.maxMessageBytes) {
      throw new OversizedMessageError(`a JSON message of ${size} bytes; the limit is ${this.maxMessageBytes}`);
    }
    let row;
    try {
      row = readJson(typeof payload === "string" ? payload : utf8.decode(asBytes(payload)));
    } catch (error) {
      const why = error instanceof TypeError ? "it is not UTF-8" : error.message;
      throw new MalformedMessageError(`a JSON message that does not parse: ${why}`);
    }
    if (!isObject(row) || !(row.type === "start" || row.type === "done")) {
      const found = isObject(row) ? `type ${shown(row.type ?? null)}` : `a JSON ${jsonType(row)}`;
      throw new MalformedMessageError(`a JSON message with ${found}; expected an object of type "start" or "done"`);
    }
    if (row.type === "start") {
      if (this.start !== null) throw new MalformedMessageError("a second start message in one stream");
      this.start = readStart(row);
      return this.start;
    }
    if (this.start === null) throw new MalformedMessageError("a done message before the start message");
    if (this.done !== null) throw new FramesAfterEndError("a second done message");
    const reason = messageField(row, "reason", "a string");
    if (!DONE_REASONS.includes(reason)) {
      throw new MalformedMessageError(`done: reason ${shown(reason)}; known: ${DONE_REASONS.join(", ")}`);
    }
    const done = {
      type: "done",
      total_frames: messageField(row, "total_frames", "an integer"),
      last_seq: messageField(row, "last_seq", "an integer", true),
      reason,
      error: messageField(row, "error", "a string", true),
    };
    if (reason === "complete" && done.total_frames !== this.framesReceived) {
      throw new SequenceGapError(
        `done says ${done.total_frames} frames, ${this.framesReceived} arrived; frames were lost`,
      );
    }
    this.done = done;
    return done;
  }

  /** A binary frames message. */
  parseFrames(data) {
    const start = this.start;
    if (start === null) throw new MalformedMessageError("a frames message before the start message");
    const payload = asBytes(data);
    if (payload.length < HEADER_BYTES) {
      throw new TruncatedMessageError(
        `a frames message of ${payload.length} bytes; the header alone is ${HEADER_BYTES}`,
      );
    }
    const view = new DataView(payload.buffer, payload.byteOffset, HEADER_BYTES);
    const version = view.getUint8(0);
    const flags = view.getUint8(1);
    const count = view.getUint16(2, true);
    const seq = view.getUint32(4, true);
    const firstFrame = view.getUint32(8, true);
    if (version !== PROTOCOL_VERSION) {
      throw new BadVersionError(`frames message ${seq}: version ${version}; this client speaks ${PROTOCOL_VERSION}`);
    }
    if (flags & ~KNOWN_FLAGS) {
      const unknown = (flags & ~KNOWN_FLAGS).toString(16).padStart(2, "0");
      throw new MalformedMessageError(`frames message ${seq}: unknown flag bits 0x${unknown}`);
    }
    if (count > start.max_frames_per_message) {
      throw new TooManyFramesError(
        `frames message ${seq}: ${count} frames; the stream allows ${start.max_frames_per_message} per message`,
      );
    }
    if (count === 0 && !flags) throw new MalformedMessageError(`frames message ${seq}: no frames and no flag`);
    const expected = HEADER_BYTES + payloadBytes(start, count);
    if (payload.length < expected) {
      throw new TruncatedMessageError(`frames message ${seq}: ${payload.length} bytes, ${count} frames need ${expected}`);
    }
    if (payload.length > expected) {
      throw new OversizedMessageError(`frames message ${seq}: ${payload.length} bytes, ${count} frames need ${expected}`);
    }
    if (seq < this.nextSeq) {
      throw new DuplicateMessageError(`frames message ${seq} again (expected ${this.nextSeq}); ignored`);
    }
    if (this.ended || this.done !== null) {
      throw new FramesAfterEndError(`frames message ${seq} after the end of the stream`);
    }
    if (seq > this.nextSeq) {
      throw new SequenceGapError(`frames message ${seq} arrived, expected ${this.nextSeq}: messages were lost`);
    }
    if (firstFrame !== this.framesReceived) {
      throw new SequenceGapError(
        `frames message ${seq} starts at frame ${firstFrame}, ${this.framesReceived} frames arrived before it`,
      );
    }
    const body = payload.subarray(HEADER_BYTES);
    const total = count * start.num_quantizers;
    let codes;
    if (start.packing === "int16") {
      const values = new DataView(body.buffer, body.byteOffset, body.byteLength);
      codes = new Int32Array(total);
      for (let i = 0; i < total; i++) codes[i] = values.getInt16(2 * i, true);
    } else {
      codes = unpack11(body, total);
    }
    for (const code of codes) {
      if (code < 0 || code >= start.codebook_size) {
        throw new CodesOutOfRangeError(
          `frames message ${seq}: code ${code} is outside 0..${start.codebook_size - 1}; the stream is corrupt`,
        );
      }
    }
    this.nextSeq += 1;
    this.framesReceived += count;
    this.ended = Boolean(flags & FLAG_END_OF_STREAM);
    return {
      type: "frames",
      frames: codes,
      count,
      numQuantizers: start.num_quantizers,
      flags: {
        endOfStream: Boolean(flags & FLAG_END_OF_STREAM),
        segmentEnd: Boolean(flags & FLAG_SEGMENT_END),
        reset: Boolean(flags & FLAG_RESET),
      },
      flagBits: flags,
      seq,
      firstFrame,
    };
  }

  // -- byte streams (recordings, HTTP bodies) -------------------------------------------------------

  /**
   * Feed the next bytes of a recording (magic, then kind byte, u32 length, payload per message); returns the
   * events of the messages completed by them. A record's length is checked against the limit before its
   * payload is allocated. Bytes after the done message are ignored (the stream is over, as in Python's
   * iter_events). When a message throws, the error carries `events`: those completed earlier in this call.
   */
  feedRecording(chunk, { magic = true } = {}) {
    const bytes = asBytes(chunk);
    const record = this._record;
    if (record.phase === "magic" && !magic) record.phase = "header";
    const events = [];
    let offset = 0;
    try {
      while (offset < bytes.length && this.done === null) {
        if (record.phase === "magic" || record.phase === "header") {
          const size = record.phase === "magic" ? RECORDING_MAGIC.length : RECORD_HEADER_BYTES;
          const take = Math.min(size - record.filled, bytes.length - offset);
          record.header.set(bytes.subarray(offset, offset + take), record.filled);
          record.filled += take;
          offset += take;
          if (record.filled < size) break;
          record.filled = 0;
          if (record.phase === "magic") {
            const head = record.header.subarray(0, RECORDING_MAGIC.length);
            if (!head.every((byte, i) => byte === RECORDING_MAGIC[i])) {
              throw new MalformedMessageError(
                `not a codec-stream recording: it starts with ${byteText(head)}, expected ${byteText(RECORDING_MAGIC)}`,
              );
            }
            record.phase = "header";
            continue;
          }
          const kind = record.header[0];
          const length = new DataView(record.header.buffer).getUint32(1, true);
          if (kind !== KIND_JSON && kind !== KIND_BINARY) {
            throw new MalformedMessageError(`a framed message of kind ${byteText([kind])}; expected "J" or "B"`);
          }
          if (length > this.maxMessageBytes) {
            throw new OversizedMessageError(`a framed message of ${length} bytes; the limit is ${this.maxMessageBytes}`);
          }
          record.kind = kind;
          record.payload = new Uint8Array(length);
          record.phase = "payload";
        }
        if (record.phase === "payload") {
          const payload = record.payload;
          const take = Math.min(payload.length - record.filled, bytes.length - offset);
          payload.set(bytes.subarray(offset, offset + take), record.filled);
          record.filled += take;
          offset += take;
          if (record.filled < payload.length) break;
          record.filled = 0;
          record.payload = null;
          record.phase = "header";
          this.bytes += RECORD_HEADER_BYTES + payload.length;
          events.push(this.parse(record.kind, payload));
          this.messages++;
        }
      }
    } catch (error) {
      if (error instanceof CodecStreamError) error.events = events;
      throw error;
    }
    return events;
  }

  /** The byte stream ended: throws TruncatedStreamError unless it ended cleanly after the done message. */
  finishRecording() {
    if (this.done !== null) return [];
    const record = this._record;
    if (record.phase === "magic" || record.filled > 0 || record.phase === "payload") {
      const size =
        record.phase === "magic" ? RECORDING_MAGIC.length : record.phase === "header" ? RECORD_HEADER_BYTES : record.payload.length;
      throw new TruncatedStreamError(
        `the stream ended ${record.filled} bytes into a ${size}-byte read: it was cut off`,
      );
    }
    throw new TruncatedStreamError(
      `the stream ended after ${this.framesReceived} frames without a done message: it was cut off`,
    );
  }
}

/** Bytes for an error message: printable ASCII as it is, any other byte as \xNN. */
function byteText(bytes) {
  const printable = (byte) => byte >= 0x20 && byte < 0x7f && byte !== 0x5c;
  const shownByte = (byte) =>
    printable(byte) ? String.fromCharCode(byte) : `\\x${byte.toString(16).padStart(2, "0")}`;
  return `"${Array.from(bytes, shownByte).join("")}"`;
}

/** All events of a whole recording (bytes), as Python's iter_events(): throws on any error. */
export function parseRecording(bytes, parser = new CodecStreamParser()) {
  const events = parser.feedRecording(bytes);
  parser.finishRecording();
  return events;
}
