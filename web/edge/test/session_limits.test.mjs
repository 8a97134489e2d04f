// The page cuts its text by the limits the server announces in its start message, not by one server's defaults:
// a server started with lower limits takes every piece (each within its characters, each message within its
// bytes); a start that announces none is refused, not answered with a guess.

import assert from "node:assert/strict";
import { test } from "node:test";

import { sessionLimits, textPieces } from "../session_limits.mjs";
import { CodecStreamParser, MalformedMessageError, PROTOCOL } from "../stream.mjs";

const GEOMETRY = { num_quantizers: 2, codebook_size: 2048, frame_rate: 12.5, sample_rate: 24000 };

/** The start event of a stream whose start message carries `limits` (absent when undefined), from its text. */
function startWith(limits, extra = "") {
  const row = { type: "start", protocol: PROTOCOL, version: 1, ...GEOMETRY, packing: "packed11" };
  row.max_frames_per_message = 4;
  if (limits !== undefined) row.limits = limits;
  const text = JSON.stringify(row);
  return new CodecStreamParser().handleText(extra ? `${text.slice(0, -1)}, ${extra}}` : text);
}

/** What the server does with a `text` message (vllm_omni/entrypoints/websocket: socket_session.parse_message, then
 * SpeechSocket.handle): a message over max_body_bytes closes with 1009, a piece over max_input_chars with 4413. */
function serverTakes(message, limits) {
  const bytes = new TextEncoder().encode(message).length;
  if (bytes > limits.max_body_bytes) return `1009: a message of ${bytes} bytes`;
  const { text } = JSON.parse(message);
  const chars = Array.from(text).length;
  return chars > limits.max_input_chars ? `4413: a piece of ${chars} characters` : "taken";
}

const LOW = { max_input_chars: 10, max_body_bytes: 64, socket_max_queued_chars: 200, socket_idle_s: 3 };

test("the announced limits are read from the start message; none announced is a malformed start", () => {
  assert.deepStrictEqual(sessionLimits(startWith(LOW)), LOW);
  const later = sessionLimits(startWith({ ...LOW, max_sockets: 3 })); // a field this page does not know: ignored
  assert.deepStrictEqual(later, LOW);
  assert.throws(() => sessionLimits(startWith(undefined)), (error) => {
    return error instanceof MalformedMessageError && /announced no limits/.test(error.message);
  });
});

test("an announcement the page cannot cut text by is a protocol error naming the field", () => {
  for (const [key, value] of [
    ["max_input_chars", 0],
    ["max_input_chars", "10"],
    ["max_body_bytes", null],
    ["socket_max_queued_chars", true],
    ["socket_idle_s", -1],
  ]) {
    assert.throws(() => sessionLimits(startWith({ ...LOW, [key]: value })), (error) => {
      assert.ok(error instanceof MalformedMessageError && error.message.includes(key), error.message);
      return true;
    });
  }
  const floated = startWith(undefined, '"limits": {"max_input_chars": 10.0, "max_body_bytes": 64, ' +
    '"socket_max_queued_chars": 200, "socket_idle_s": 3}');
  assert.throws(() => sessionLimits(floated), /max_input_chars must be an integer/, "a count written 10.0");
  assert.throws(() => new CodecStreamParser().handleText(JSON.stringify({ ...startWith(undefined), limits: [1] })),
    MalformedMessageError, "limits that are not an object");
});

test("a server started with lower limits takes every piece the page cuts, whatever the text", () => {
  const texts = [
    "Hello there, this is a longer paste than ten characters.",
    "é".repeat(40), // 2 bytes each
    "\u{1F600}".repeat(25), // astral: 2 UTF-16 units, 4 bytes, one character
    '"quoted" \\ and \n controls \u0001 escaped'.repeat(3), // JSON escapes inflate the message
    "x",
    "",
  ];
  for (const text of texts) {
    const pieces = textPieces(text, LOW);
    assert.equal(pieces.join(""), text, "the pieces are the text, in order");
    for (const piece of pieces) {
      assert.ok(!/[\uD800-\uDBFF]$/.test(piece) && !/^[\uDC00-\uDFFF]/.test(piece), "no character split");
      assert.equal(serverTakes(JSON.stringify({ type: "text", text: piece }), LOW), "taken", JSON.stringify(piece));
    }
    assert.equal(pieces.length === 0, text === "");
  }
  // with the default server's limits the same paste closes the lower server: the limits must come from the server
  const paste = texts[0];
  const defaults = { max_input_chars: 4096, max_body_bytes: 1 << 20, socket_max_queued_chars: 16384, socket_idle_s: 60 };
  const [guessed] = textPieces(paste, defaults);
  assert.match(serverTakes(JSON.stringify({ type: "text", text: guessed }), LOW), /^(1009|4413):/);
});

test("pieces use the whole announced size: no more messages than the limits need", () => {
  const text = "a".repeat(95);
  assert.deepStrictEqual(textPieces(text, LOW).map((piece) => piece.length), [10, 10, 10, 10, 10, 10, 10, 10, 10, 5]);
  const defaults = { max_input_chars: 4096, max_body_bytes: 1 << 20, socket_max_queued_chars: 16384, socket_idle_s: 60 };
  assert.equal(textPieces("b".repeat(9000), defaults).length, 3);
});
