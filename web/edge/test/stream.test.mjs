// The JavaScript codec-stream parser against the Python one: the same events from the Python encoder's
// recordings (fed whole and byte by byte), the same events and error class for every hostile input (the messages
// are each parser's own words).

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  CodecStreamError,
  CodecStreamParser,
  DuplicateMessageError,
  ERROR_CLASSES,
  SequenceGapError,
  pack11,
  unpack11,
} from "../stream.mjs";
import { fromHex, readBytes, readJson } from "../testing/fixtures.mjs";

/** A JS event in the form make_fixtures.py writes Python's events. */
function asPython(event) {
  if (event.type !== "frames") return event;
  const frames = [];
  for (let t = 0; t < event.count; t++) {
    frames.push(Array.from(event.frames.subarray(t * event.numQuantizers, (t + 1) * event.numQuantizers)));
  }
  return { type: "frames", seq: event.seq, first_frame: event.firstFrame, flags: event.flagBits, frames };
}

/** Events and error of a recording fed in pieces of `piece` bytes (Infinity: whole). */
function readRecording(bytes, piece, maxMessageBytes) {
  const parser = new CodecStreamParser(maxMessageBytes ? { maxMessageBytes } : {});
  const events = [];
  try {
    const step = Number.isFinite(piece) ? piece : bytes.length || 1;
    for (let at = 0; at < bytes.length; at += step) {
      events.push(...parser.feedRecording(bytes.subarray(at, at + step)));
    }
    parser.finishRecording();
  } catch (error) {
    if (!(error instanceof CodecStreamError)) throw error;
    events.push(...(error.events ?? []));
    return { events: events.map(asPython), error };
  }
  return { events: events.map(asPython), error: null };
}

function readMessages(messages, maxMessageBytes) {
  const parser = new CodecStreamParser(maxMessageBytes ? { maxMessageBytes } : {});
  const events = [];
  for (const [kind, hex] of messages) {
    try {
      events.push(asPython(parser.parse(kind, fromHex(hex))));
    } catch (error) {
      if (!(error instanceof CodecStreamError)) throw error;
      return { events, error };
    }
  }
  return { events, error: null };
}

const golden = readJson("stream", "golden.json");
const hostile = readJson("stream", "hostile.json");

test("golden recordings give Python's events, fed whole and byte by byte", () => {
  assert.ok(golden.length >= 5);
  for (const row of golden) {
    const bytes = readBytes("stream", row.file);
    for (const piece of [Infinity, 1, 7]) {
      const { events, error } = readRecording(bytes, piece);
      assert.equal(error, null, `${row.name} (pieces of ${piece}): ${error?.name}: ${error?.message}`);
      assert.deepStrictEqual(events, row.events, `${row.name} (pieces of ${piece})`);
    }
  }
});

test("golden recordings as WebSocket messages give the same events", () => {
  for (const row of golden) {
    const bytes = readBytes("stream", row.file);
    const records = new CodecStreamParser();
    records.feedRecording(bytes.subarray(0, 4));
    const parser = new CodecStreamParser();
    const events = [];
    let at = 4;
    while (at < bytes.length) {
      const kind = bytes[at];
      const length = new DataView(bytes.buffer, bytes.byteOffset + at + 1, 4).getUint32(0, true);
      const payload = bytes.subarray(at + 5, at + 5 + length);
      at += 5 + length;
      events.push(kind === 0x4a ? parser.handleText(new TextDecoder().decode(payload)) : parser.handleBinary(payload));
    }
    assert.deepStrictEqual(events.map(asPython), row.events, row.name);
    assert.equal(parser.bytes, bytes.length - 4 - 5 * events.length, "bytes counts every message's payload");
  }
});

test("every hostile input gives Python's events, then the same error class", () => {
  let errors = 0;
  const classes = new Set();
  for (const row of hostile) {
    const outcome =
      row.transport === "recording"
        ? readRecording(fromHex(row.data), Infinity, row.max_message_bytes)
        : readMessages(row.messages, row.max_message_bytes);
    assert.deepStrictEqual(outcome.events, row.events, `${row.name}: events`);
    if (row.error === null) {
      assert.equal(outcome.error, null, `${row.name}: Python parses it, JS threw ${outcome.error?.name}: ${outcome.error?.message}`);
      continue;
    }
    errors++;
    classes.add(row.error);
    assert.ok(outcome.error, `${row.name}: Python raised ${row.error} (${row.message}), JS did not`);
    assert.ok(outcome.error instanceof ERROR_CLASSES[row.error], `${row.name}: expected ${row.error}, got ${outcome.error.name}`);
    assert.equal(outcome.error.name, row.error, row.name);
    const { message } = outcome.error;
    assert.ok(message.length >= 20, `${row.name}: a message that says what broke: ${message}`);
  }
  assert.ok(errors > 500, `${errors} hostile inputs raised`);
  assert.ok(classes.size >= 10, `error classes seen: ${[...classes]}`);
});

test("hostile recordings fed byte by byte fail with the same class", () => {
  for (const row of hostile.filter((r) => r.transport === "recording")) {
    const outcome = readRecording(fromHex(row.data), 1, row.max_message_bytes);
    assert.deepStrictEqual(outcome.events, row.events, `${row.name}: events`);
    assert.equal(outcome.error?.name ?? null, row.error, row.name);
  }
});

test("a WebSocket duplicate is skipped and counted; errors leave the parser's state as it was", () => {
  const row = hostile.find((r) => r.name === "frames_after_end");
  const [[, start], [, one], [, two], [, three]] = row.messages;
  const parser = new CodecStreamParser();
  parser.handleText(new TextDecoder().decode(fromHex(start)));
  assert.equal(parser.handleBinary(fromHex(one)).seq, 0);
  assert.equal(parser.handleBinary(fromHex(one)), null);
  assert.equal(parser.duplicates, 1);
  assert.throws(() => parser.parseFrames(fromHex(one)), DuplicateMessageError);
  assert.throws(() => parser.handleBinary(fromHex(three)), SequenceGapError);
  assert.equal(parser.nextSeq, 1);
  assert.equal(parser.framesReceived, 1);
  assert.equal(parser.handleBinary(fromHex(two)).seq, 1);
  assert.equal(parser.handleBinary(fromHex(three)).firstFrame, 2);
});

test("11-bit packing round-trips and matches the pinned bytes", () => {
  assert.deepStrictEqual(Array.from(pack11([1, 2047])), [0x01, 0xf8, 0x3f]);
  for (const count of [1, 7, 16, 33]) {
    const codes = Int32Array.from({ length: count }, (_, i) => (i * 977 + 2047) % 2048);
    assert.deepStrictEqual(unpack11(pack11(codes), count), codes);
  }
});
