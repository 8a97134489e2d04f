// Audio the server decodes, for a page too slow to decode in real time (the hand-over; the server's side is
// vllm_omni/entrypoints/websocket/server_audio.py): the client asks with {"type": "server_audio", "from_frame": D}
// and then receives `pcm` text messages beside the codec frames, the first starting at sample D x samples per frame,
// each next one where the last ended.

export class ServerAudioError extends Error {
  constructor(message) {
    super(message);
    this.name = "ServerAudioError";
  }
}

export const PCM_FORMAT = "f32le";
export const MAX_PCM_MESSAGE_SAMPLES = 24000; // the server's bound per message

/** The client's request: the audio from the stream's frame `fromFrame` on (the frames the page has played). */
export const serverAudioRequest = (fromFrame) => JSON.stringify({ type: "server_audio", from_frame: fromFrame });

/**
 * A text message as a `pcm` event `{type: "pcm", firstSample, samples: Float32Array}`, or null when it is not a
 * JSON object of type "pcm" (the codec stream's own messages). A `pcm` message that breaks the format (fields,
 * sizes, the sample rate the plan says) throws ServerAudioError: the page never plays audio it cannot place.
 */
export function readPcmMessage(text, sampleRate) {
  if (!text.startsWith("{")) return null;
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    return null; // the codec stream's parser reports it
  }
  if (message?.type !== "pcm") return null;
  const { first_sample: first, samples, sample_rate: rate, format, audio } = message;
  if (!Number.isSafeInteger(first) || first < 0 || !Number.isSafeInteger(samples) || samples < 1) {
    throw new ServerAudioError(`a pcm message needs first_sample >= 0 and samples >= 1, got ${first} and ${samples}`);
  }
  if (samples > MAX_PCM_MESSAGE_SAMPLES) {
    throw new ServerAudioError(`a pcm message of ${samples} samples; at most ${MAX_PCM_MESSAGE_SAMPLES} are sent at once`);
  }
  if (format !== PCM_FORMAT || rate !== sampleRate) {
    throw new ServerAudioError(`pcm as ${format} at ${rate} Hz; this page plays ${PCM_FORMAT} at ${sampleRate} Hz`);
  }
  let bytes;
  try {
    bytes = Uint8Array.from(atob(audio), (c) => c.charCodeAt(0));
  } catch {
    throw new ServerAudioError("a pcm message whose audio is not base64");
  }
  if (bytes.length !== samples * 4) {
    throw new ServerAudioError(`a pcm message says ${samples} samples but carries ${bytes.length} bytes`);
  }
  const view = new DataView(bytes.buffer);
  const pcm = new Float32Array(samples);
  for (let i = 0; i < samples; i++) pcm[i] = view.getFloat32(i * 4, true);
  return { type: "pcm", firstSample: first, samples: pcm };
}
