"""The device's speaker over a benchmark's timeline: the client's own model (``PlaybackClock``), not a second one."""

from __future__ import annotations

from collections.abc import Iterable


def speaker(arrivals: Iterable[tuple[float, float]], jitter_s: float) -> dict:
    """Play ``arrivals`` (``(time, audio seconds)`` in order, as decoded) behind a ``jitter_s`` buffer.

    :class:`vllm_omni.edge.client.PlaybackClock` decides, and is told the stream is over at the last arrival
    (what is buffered then plays). Returns ``start`` and ``end`` of playback (None if nothing played),
    ``playing`` (``[from, to]`` stretches), ``stall_s`` (the waits from running dry to playing again, summed),
    ``stalls`` and ``longest_stall_s``; times are those of ``arrivals``.
    """
    from vllm_omni.edge.client.playback import PlaybackClock

    clock = PlaybackClock(jitter_s)
    last = None
    for now, seconds in arrivals:
        clock.add(seconds, now)
        last = now
    if last is not None:
        clock.finish(last)
    return {
        "start": clock.started_at,
        "end": clock.ends_at,
        "playing": clock.playing,
        "stall_s": float(sum(clock.stalls)),
        "stalls": len(clock.stalls),
        "longest_stall_s": float(max(clock.stalls, default=0.0)),
    }
