// What the server's WebSocket session takes from the page, as the server announces it, and text cut to fit.
//
// The server's start message carries `limits` (vllm_omni.edge.stream.SessionLimits: the server's own flags, e.g.
// --speech-max-input-chars), so the page cuts its text by the limits of the server it talks to, whatever that
// server was started with. The page is served by the server it talks to, so a start without the announcement is
// a broken stream, not an older server: the page holds no copy of any server's defaults.

import { isWrittenInteger, shown } from "./json_text.mjs";
import { MalformedMessageError } from "./stream.mjs";

const COUNTS = ["max_input_chars", "max_body_bytes", "socket_max_queued_chars"];

/**
 * The limits of the session whose start event is `start` (a CodecStreamParser start event). No announcement, or one
 * that lacks a field or gives a wrong one, is a MalformedMessageError: the page would otherwise cut its text by a
 * guess; a field this page does not know is ignored (a later server may announce more).
 */
export function sessionLimits(start) {
  const row = start.limits;
  if (row === undefined || row === null) {
    throw new MalformedMessageError("start: the server announced no limits, which typed text is cut by");
  }
  for (const key of COUNTS) {
    if (!isWrittenInteger(row, key) || row[key] < 1) {
      const found = shown(row[key] ?? null);
      throw new MalformedMessageError(`start: limits: ${key} must be an integer >= 1, found ${found}`);
    }
  }
  const idle = row.socket_idle_s;
  if (!(typeof idle === "number" && Number.isFinite(idle) && idle > 0)) {
    throw new MalformedMessageError(`start: limits: socket_idle_s must be a number > 0, found ${shown(idle ?? null)}`);
  }
  const limits = Object.freeze(Object.fromEntries([...COUNTS, "socket_idle_s"].map((key) => [key, row[key]])));
  return limits;
}

const utf8Bytes = (text) => new TextEncoder().encode(text).length;

/**
 * `text` as the `text` pieces the session takes: each at most `max_input_chars` characters (code points, as the
 * server counts them) and each message `{"type": "text", "text": piece}` at most `max_body_bytes` UTF-8 bytes (a
 * piece over that is halved until it fits; a single character that still does not fit is sent, and the server's
 * refusal says why). A character is never split.
 */
export function textPieces(text, limits) {
  const points = Array.from(text);
  const pending = [];
  for (let at = 0; at < points.length; at += limits.max_input_chars) {
    pending.push(points.slice(at, at + limits.max_input_chars));
  }
  const pieces = [];
  while (pending.length) {
    const piece = pending.shift();
    const joined = piece.join("");
    if (piece.length > 1 && utf8Bytes(JSON.stringify({ type: "text", text: joined })) > limits.max_body_bytes) {
      const half = piece.length >> 1;
      pending.unshift(piece.slice(0, half), piece.slice(half));
      continue;
    }
    pieces.push(joined);
  }
  return pieces;
}
