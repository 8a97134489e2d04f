"""The speech feature's own metrics, on the server's ``/metrics`` beside vLLM's (behind the API key when there is
one): Prometheus conventions, names ``vllm_omni_speech_*``, base units (seconds), histograms whose buckets resolve
10 ms to 10 s. Registered on prometheus_client's default registry, which vLLM's exporter serves; with several API
processes vLLM's multiprocess collector gathers them (gauges summed over the live processes).

==========================================  =========================================================================
``first_frame_seconds{route,text_mode}``     from the request (HTTP: its body read; WebSocket: the utterance's
                                             ``input.done`` or first text) to the talker's first frame
``first_audio_seconds{route,text_mode}``     from the same moment to the first audio leaving the server (PCM or encoded
                                             audio, an SSE delta, or a codec frames message)
``frames_total{route}``                      codec frames sent; ``audio_seconds_total{route}`` the speech they hold
``streams_open``                             HTTP speech responses in flight
``sessions_open{vocabulary}``                WebSocket sessions open (``upstream``, ``first``)
``refusals_total{reason}``                   requests and sessions refused, by the bound or rule that refused them
``failures_total{cause}``                    speech cut or failed inside the server (``engine``: the engine died,
                                             ``shutdown``: ended by a drain's end, ``server``: anything else)
``handovers_total``                          devices handed over to audio decoded on the server
``plan_downloads_total{hardware,kind}``      plans (``plan``) and artifacts (``artifact``) served, by class
==========================================  =========================================================================

``route``: ``speech`` (``POST /v1/audio/speech``), ``batch``, ``websocket``. ``text_mode``: ``whole`` (the text at
once), ``sentence``, ``stream``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

PREFIX = "vllm_omni_speech_"
BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SpeechMetrics:
    """The metrics of this process (:func:`speech_metrics`); ``registry``: prometheus_client's default unless given
    (tests give their own)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = REGISTRY if registry is None else registry

        def histogram(name: str, text: str, labels: tuple[str, ...]) -> Any:
            return Histogram(PREFIX + name, text, labels, buckets=BUCKETS_S, registry=registry)

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Any:
            return Counter(PREFIX + name, text, labels, registry=registry)

        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> Any:
            return Gauge(PREFIX + name, text, labels, registry=registry, multiprocess_mode="livesum")

        self.first_frame = histogram(
            "first_frame_seconds", "Time from a speech request to the talker's first frame", ("route", "text_mode")
        )
        self.first_audio = histogram(
            "first_audio_seconds", "Time from a speech request to its first audio sent", ("route", "text_mode")
        )
        self.frames = counter("frames", "Codec frames sent", ("route",))
        self.audio_seconds = counter("audio_seconds", "Seconds of speech sent, as codec frames or audio", ("route",))
        self.streams_open = gauge("streams_open", "HTTP speech responses in flight")
        self.sessions_open = gauge("sessions_open", "Speech WebSocket sessions open", ("vocabulary",))
        self.refusals = counter("refusals", "Speech requests and sessions refused, by reason", ("reason",))
        self.failures = counter("failures", "Speech cut or failed inside the server, by cause", ("cause",))
        self.handovers = counter("handovers", "Devices handed over to audio decoded on the server")
        self.plan_downloads = counter(
            "plan_downloads", "Execution plans and artifacts served, by hardware class", ("hardware", "kind")
        )

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def failed(self, cause: str) -> None:
        self.failures.labels(cause).inc()


@functools.cache
def speech_metrics() -> SpeechMetrics:
    """This process's metrics, registered once on first use."""
    return SpeechMetrics()


class Meter:
    """One utterance measured: made when the server has its request (``started``), it records the first frame
    (:meth:`frames`, a pass-through of the talker's frames), the first audio (:meth:`sent`) and the frames sent.
    ``seconds_per_frame``: the audio one frame holds (the plan's hop over its sample rate). ``whole``: the audio
    leaves in one piece at the end (:meth:`delivered`), not as it is made."""

    def __init__(
        self,
        route: str,
        text_mode: str,
        seconds_per_frame: float,
        metrics: SpeechMetrics | None = None,
        whole: bool = False,
    ) -> None:
        self.metrics = metrics or speech_metrics()
        self.route, self.text_mode, self.seconds_per_frame, self.whole = route, text_mode, seconds_per_frame, whole
        self.started = time.monotonic()
        self.framed = self.heard = False

    def restart(self) -> None:
        """The next utterance of a session begins now (its first frame and audio are measured from here)."""
        self.started = time.monotonic()
        self.framed = self.heard = False

    async def frames(self, source: AsyncIterator[np.ndarray]) -> AsyncIterator[np.ndarray]:
        """``source`` as it is, the first non-empty batch's time recorded; closing this closes ``source``."""
        try:
            async for batch in source:
                if len(batch) and not self.framed:
                    self.framed = True
                    self.metrics.first_frame.labels(self.route, self.text_mode).observe(self._since())
                yield batch
        finally:
            await source.aclose()

    def sent(self, frames: int = 0, audio: bool = True) -> None:
        """Audio left the server (``audio``; a start message is not audio), holding ``frames`` new frames."""
        if audio and not self.whole:
            self.delivered()
        if frames:
            self.metrics.frames.labels(self.route).inc(frames)
            self.metrics.audio_seconds.labels(self.route).inc(frames * self.seconds_per_frame)

    def delivered(self) -> None:
        """The first audio left (once): a whole answer's, when it is sent."""
        if not self.heard:
            self.heard = True
            self.metrics.first_audio.labels(self.route, self.text_mode).observe(self._since())

    def _since(self) -> float:
        return time.monotonic() - self.started
