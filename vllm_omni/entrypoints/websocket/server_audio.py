"""Audio the server decodes for a codec-stream session whose device cannot decode in real time (the page's
hand-over): from a frame the client names on, the session's PCM follows its codec frames on the same socket.

The client's ``{"type": "server_audio", "from_frame": D}`` says it has played the audio of the stream's first ``D``
frames (counted across segments) and wants the rest from the server. The stateful decoder needs every frame from
the start of a segment, so the server decodes the frames it already sent (a segment end flushes, as on the device),
keeps the samples from ``D x samples_per_frame`` on, and from then on decodes each frames message as it sends it.
Each piece of PCM is a JSON text message::

    {"type": "pcm", "first_sample": N, "samples": K, "sample_rate": 24000, "format": "f32le", "audio": BASE64}

``first_sample`` counts the stream's samples as the device counts them (each frame gives ``samples_per_frame``), so
the first message starts at ``D x samples_per_frame`` and each next one where the last ended: a client sees a gap or
a repeat as a mismatch. Float32 little-endian: the samples are the server decoder's, bit for bit. PCM asked for
before the server sends the stream's done message is all sent before it (a client sure of that sends ``end`` after
its request); a request the server reads after done but before its close is answered whole, then the close. A client
that may ask late (a page that learns it is too slow while it works through frames the server sent long ago) says so
at the start (``"server_audio": true``): the session then stays open after done until the client asks, closes, or
idles out, and PCM asked for after done follows it, the session closing once it is all sent."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np

PCM_FORMAT = "f32le"
MAX_PCM_MESSAGE_SAMPLES = 24000  # at most a second of 24 kHz audio per message (128 KiB of base64)


class ServerAudioError(ValueError):
    """A ``server_audio`` request the session refuses (asked twice, or from a frame it has not sent)."""


class ServerAudio:
    """The frames a session sent (a segment end as ``None``) and, once asked for, their PCM decoded here.

    ``send_text`` sends one text message. The speaker calls :meth:`frames` and :meth:`segment_end` before it sends
    each; the session's reader calls :meth:`start`. One lock orders the two, so each frame is decoded once, in
    stream order, whichever comes first; a whole segment that ended before the requested frame is not decoded (its
    decoder state ends with it)."""

    def __init__(self, speech: Any, send_text: Any) -> None:
        self.speech, self.send_text = speech, send_text
        self.lock = asyncio.Lock()
        self.sent: list[np.ndarray | None] = []
        self.frames_sent = 0
        self.from_sample: int | None = None  # set once asked: the first stream sample the client wants
        self.next_sample = 0  # the stream sample the decoder's next output starts at
        self.decoder: Any = None
        self.caught_up = asyncio.Event()  # set once the frames sent before the request are decoded and sent

    @property
    def active(self) -> bool:
        return self.from_sample is not None

    async def start(self, from_frame: Any) -> None:
        """Decode the frames sent so far and send their PCM from ``from_frame`` on; later frames follow as sent."""
        if type(from_frame) is not int or from_frame < 0:
            raise ServerAudioError(f"server_audio needs 'from_frame', a frame count >= 0, got {from_frame!r}")
        async with self.lock:
            if self.active:
                raise ServerAudioError("server_audio was already asked for in this session")
            if from_frame > self.frames_sent:
                raise ServerAudioError(
                    f"server_audio from frame {from_frame}, but the session has sent {self.frames_sent} frames"
                )
            from vllm_omni.edge.runtime import open_decoder

            self.decoder = await self.speech.decode(
                lambda: open_decoder(self.speech.server_decoder, check_sha256=False, prepack=True)
            )
            per_frame = self.decoder.codec.samples_per_frame
            self.from_sample = from_frame * per_frame
            for segment in _segments(self.sent):
                frames = sum(len(batch) for batch in segment if batch is not None)
                if segment[-1] is None and self.next_sample + frames * per_frame <= self.from_sample:
                    self.next_sample += frames * per_frame  # a whole segment before the request: nothing to send
                    continue
                for item in segment:
                    await self._decode(item)
            self.sent.clear()  # decoded: nothing needs them again
            self.caught_up.set()

    async def frames(self, batch: np.ndarray) -> None:
        """A frames message is about to be sent: ``[T, Q]`` codes (counted before the send, so a client that
        received them may name them while the send is still under way)."""
        async with self.lock:
            self.frames_sent += len(batch)
            if self.active:
                await self._decode(batch)
            else:
                self.sent.append(batch)

    async def segment_end(self) -> None:
        """A segment (or the stream) ended: the device's decoder flushes here, and so does this one."""
        async with self.lock:
            if self.active:
                await self._decode(None)
            else:
                self.sent.append(None)

    async def _decode(self, item: np.ndarray | None) -> None:
        decoder = self.decoder
        pcm = await (self.speech.decode(decoder.flush) if item is None else self.speech.decode(decoder.feed, item))
        first = self.next_sample
        self.next_sample += len(pcm)
        skip = max(0, self.from_sample - first)
        for start in range(skip, len(pcm), MAX_PCM_MESSAGE_SAMPLES):
            piece = np.ascontiguousarray(pcm[start : start + MAX_PCM_MESSAGE_SAMPLES], dtype="<f4")
            await self.send_text(pcm_message(first + start, piece, decoder.codec.sample_rate))


def _segments(sent: list[np.ndarray | None]) -> list[list[np.ndarray | None]]:
    """``sent`` cut after each segment end (``None``); the last piece may be a segment still going on."""
    segments: list[list[np.ndarray | None]] = [[]]
    for item in sent:
        segments[-1].append(item)
        if item is None:
            segments.append([])
    return [segment for segment in segments if segment]


def pcm_message(first_sample: int, samples: np.ndarray, sample_rate: int) -> str:
    """One ``pcm`` message (the module docstring) of float32 ``samples`` starting at stream sample ``first_sample``."""
    return json.dumps(
        {
            "type": "pcm",
            "first_sample": first_sample,
            "samples": len(samples),
            "sample_rate": sample_rate,
            "format": PCM_FORMAT,
            "audio": base64.b64encode(np.ascontiguousarray(samples, dtype="<f4").tobytes()).decode(),
        }
    )
