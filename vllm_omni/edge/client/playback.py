"""A model of the device's speaker: how often the audio would have run dry behind a jitter buffer."""

from __future__ import annotations

import itertools


class PlaybackClock:
    """A speaker draining audio in real time behind a jitter buffer; counts the times it would run dry.

    Playback starts once ``jitter`` seconds are buffered; when the buffered audio ends before new
    audio arrives, that is an underrun and playback waits for the buffer to fill again. Times are
    the caller's clock (seconds). Beside the count it keeps what a timeline needs: each stretch it
    played (``[from, to]``), from which the start and the stalls (from running dry to playing again)
    follow.
    """

    def __init__(self, jitter_seconds: float):
        self.jitter = jitter_seconds
        self.underruns = 0
        self.playing: list[list[float]] = []  # [from, to] of each stretch played without running dry
        self._buffered = 0.0  # audio seconds not yet played when playback is paused
        self._playing_since: float | None = None  # wall time at which the queued audio started playing
        self._queued = 0.0  # audio seconds queued since then

    @property
    def started_at(self) -> float | None:
        """When playback first started; None before."""
        return self.playing[0][0] if self.playing else None

    @property
    def stalls(self) -> list[float]:
        """Seconds from running dry to playing again, per stall: the gaps between the stretches played."""
        return [after[0] - before[1] for before, after in itertools.pairwise(self.playing)]

    @property
    def ends_at(self) -> float | None:
        """When the audio queued so far ends playing; None while paused."""
        return None if self._playing_since is None else self._playing_since + self._queued

    def add(self, seconds: float, now: float) -> None:
        if self._playing_since is not None and now > self._playing_since + self._queued:
            self.underruns += 1  # the speaker ran dry before this audio arrived
            self._playing_since, self._buffered = None, 0.0
        if self._playing_since is None:
            self._buffered += seconds
            if self._buffered >= self.jitter:
                self._play(now)
        else:
            self._queued += seconds
            self.playing[-1][1] = self._playing_since + self._queued

    def finish(self, now: float) -> None:
        """The stream is over at ``now``: what is buffered plays, jitter buffer full or not."""
        if self._playing_since is None and self._buffered > 0:
            self._play(now)

    def _play(self, now: float) -> None:
        self._playing_since, self._queued, self._buffered = now, self._buffered, 0.0
        self.playing.append([now, now + self._queued])
