// Playback with a jitter buffer, on the audio thread. PCM chunks (Float32Array, mono, at the context's rate)
// arrive on the port; output starts once `jitterSamples` are buffered (or the utterance ended), and an empty
// buffer before the end counts as an underrun and waits for the jitter buffer to fill again.
//
// Port messages in: {type: "start"} (a new utterance: drop what is queued), {type: "pcm", samples},
// {type: "end"} (no more PCM: play out what is queued), {type: "stop"} (silence now).
// Out: {type: "stats", played, underruns, buffered} every ~250 ms while playing, and when the end has played.

class EdgePlayback extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.jitterSamples = options.processorOptions?.jitterSamples ?? 4800;
    this.reset();
    this.port.onmessage = ({ data }) => {
      if (data.type === "pcm") {
        this.chunks.push(data.samples);
        this.buffered += data.samples.length;
      } else if (data.type === "end") {
        this.ended = true;
      } else {
        this.reset(); // start, stop
      }
    };
  }

  reset() {
    this.chunks = [];
    this.offset = 0; // into chunks[0]
    this.buffered = 0;
    this.playing = false;
    this.ended = false;
    this.played = 0;
    this.underruns = 0;
    this.sinceStats = 0;
  }

  process(_inputs, outputs) {
    const channel = outputs[0][0];
    if (!this.playing && (this.buffered >= this.jitterSamples || (this.ended && this.buffered > 0))) this.playing = true;
    let written = 0;
    if (this.playing) {
      while (written < channel.length && this.chunks.length) {
        const chunk = this.chunks[0];
        const take = Math.min(chunk.length - this.offset, channel.length - written);
        channel.set(chunk.subarray(this.offset, this.offset + take), written);
        written += take;
        this.offset += take;
        if (this.offset === chunk.length) {
          this.chunks.shift();
          this.offset = 0;
        }
      }
      this.buffered -= written;
      this.played += written;
      if (this.buffered === 0) {
        this.playing = false;
        if (this.ended) {
          this.port.postMessage({ type: "stats", played: this.played, underruns: this.underruns, buffered: 0, done: true });
          this.ended = false;
        } else {
          this.underruns += 1;
        }
      }
    }
    channel.fill(0, written);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(channel);
    this.sinceStats += channel.length;
    if (this.playing && this.sinceStats >= sampleRate / 4) {
      this.sinceStats = 0;
      this.port.postMessage({ type: "stats", played: this.played, underruns: this.underruns, buffered: this.buffered });
    }
    return true;
  }
}

registerProcessor("edge-playback", EdgePlayback);
