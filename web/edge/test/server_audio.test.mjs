// The server's audio messages (the hand-over of a page too slow for real time) as the page reads them.

import assert from "node:assert/strict";
import { test } from "node:test";

import { ServerAudioError, readPcmMessage, serverAudioRequest } from "../server_audio.mjs";

const pcmText = (fields, samples = Float32Array.of(0.5, -0.25, 1e-7)) =>
  JSON.stringify({
    type: "pcm",
    first_sample: 96,
    samples: samples.length,
    sample_rate: 24000,
    format: "f32le",
    audio: Buffer.from(samples.buffer).toString("base64"),
    ...fields,
  });

test("a pcm message gives its samples bit for bit and where they start", () => {
  const event = readPcmMessage(pcmText({}), 24000);
  assert.equal(event.type, "pcm");
  assert.equal(event.firstSample, 96);
  assert.deepStrictEqual(event.samples, Float32Array.of(0.5, -0.25, 1e-7));
  assert.equal(serverAudioRequest(12), '{"type":"server_audio","from_frame":12}');
});

test("the codec stream's own text messages are not pcm", () => {
  assert.equal(readPcmMessage('{"type": "start", "protocol": "x"}', 24000), null);
  assert.equal(readPcmMessage("not json", 24000), null);
  assert.equal(readPcmMessage("[1, 2]", 24000), null);
});

test("a pcm message that cannot be placed or played is refused with what was expected", () => {
  const refusals = [
    [{ first_sample: -1 }, /first_sample >= 0/],
    [{ samples: 0 }, /samples >= 1/],
    [{ samples: 24001 }, /at most 24000/],
    [{ sample_rate: 16000 }, /at 16000 Hz; this page plays f32le at 24000 Hz/],
    [{ format: "s16le" }, /pcm as s16le/],
    [{ samples: 4 }, /says 4 samples but carries 12 bytes/],
    [{ audio: "%%%" }, /not base64/],
  ];
  for (const [fields, pattern] of refusals) {
    assert.throws(() => readPcmMessage(pcmText(fields), 24000), (error) => error instanceof ServerAudioError && pattern.test(error.message));
  }
});
