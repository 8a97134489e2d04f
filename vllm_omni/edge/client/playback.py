"""A model of the device's speaker: how often the audio would have run dry behind a jitter buffer."""

from __future__ import annotations


class PlaybackClock:
    """A speaker draining audio in real time behind a jitter buffer; counts the times it would run dry.

    Playback starts once ``jitter`` seconds are buffered; when the buffered audio ends before new
    audio arrives, that is an underrun and playback waits for the buffer to fill again.
    """

    def __init__(self, jitter_seconds: float):
        self.jitter = jitter_seconds
        self.underruns = 0
        self._buffered = 0.0  # audio seconds not yet played when playback is paused
        self._playing_since: float | None = None  # wall time at which the queued audio started playing
        self._queued = 0.0  # audio seconds queued since then

    def add(self, seconds: float, now: float) -> None:
        if self._playing_since is not None and now > self._playing_since + self._queued:
            self.underruns += 1  # the speaker ran dry before this audio arrived
            self._playing_since, self._buffered = None, 0.0
        if self._playing_since is None:
            self._buffered += seconds
            if self._buffered >= self.jitter:
                self._playing_since, self._queued, self._buffered = now, self._buffered, 0.0
        else:
            self._queued += seconds
