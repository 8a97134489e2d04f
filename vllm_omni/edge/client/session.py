"""One client session: a codec-token stream in, audio out, decoded on this device with an execution plan.

Messages come from a :class:`MessageSource`: a byte stream (a recording, an HTTP body) is read record by record by
a reader thread into a small buffer while the decoder works (:class:`RecordedMessages`); a WebSocket gives its
messages as they are (:class:`~.text_socket.SocketMessages`). Either way each message goes once through the one
parser. Playback is modelled with a jitter buffer (:mod:`.playback`), and every time the audio would have
run dry an underrun is counted. ``reset`` drops the decoder's state and any frames not yet
decoded; ``segment end`` and ``end of stream`` flush it. A stateful decoder whose stream pauses
(:data:`DRAIN_AFTER_S` without a message, frames pending: a talker waiting for text) drains what its step
sizes take, so those frames play now instead of waiting for a full step. A duplicate message is skipped and
counted; any other protocol error, a cut-off stream or a disconnect ends the run with
:attr:`ClientReport.error` set, and the audio decoded up to then is flushed to the sinks.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from ..errors import ClientError, EdgeError
from ..plan.model import ExecPlan
from ..plan.schema import ExecPlanError
from ..runtime.open import open_decoder
from ..stream import (
    RECORD_HEADER,
    CodecStreamParser,
    DuplicateMessageError,
    FrameBatch,
    MalformedMessageError,
    StreamDone,
    StreamStart,
    TruncatedStreamError,
    read_records,
)
from .playback import PlaybackClock


@dataclass
class ClientReport:
    frames: int = 0
    audio_seconds: float = 0.0
    decode_seconds: float = 0.0
    first_audio_seconds: float | None = None  # from the first frames message to the first PCM
    real_time_factor: float | None = None
    underruns: int = 0
    duplicates: int = 0
    messages: int = 0
    stream_bytes: int = 0
    resets: int = 0
    segments: int = 0
    done_reason: str | None = None
    error: str | None = None
    wav: str | None = None
    plan_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        first = f"{self.first_audio_seconds * 1000:.0f} ms" if self.first_audio_seconds is not None else "none"
        rtf = f"{self.real_time_factor:.3f}" if self.real_time_factor is not None else "n/a"
        return (
            f"{self.frames} frames -> {self.audio_seconds:.2f} s of audio; first audio after {first}; real-time factor "
            f"{rtf}; underruns {self.underruns}; duplicates skipped {self.duplicates}; resets {self.resets}; "
            f"{self.messages} messages, {self.stream_bytes} bytes"
        )


END = object()  # the transport ended cleanly (whether the stream was complete is the parser's to say)
IDLE = object()  # no message within the wait asked for
# No message for this long with frames pending: the stream is slower than real time (a talker waiting for text);
# the decoder drains what its step sizes take instead of holding it for a full step.
DRAIN_AFTER_S = 0.1


class MessageSource:
    """Where a session's messages come from, one ``(kind, payload)`` at a time (kind ``J`` or ``B``).

    ``framing_bytes``: what each message took on the wire besides its payload (the record header of a byte
    stream; none for a WebSocket message, which is framed by the transport).
    """

    framing_bytes = 0

    def receive(self, idle_s: float | None) -> Any:
        """The next ``(kind, payload)``; :data:`IDLE` once ``idle_s`` passed without one (None: wait for one);
        :data:`END` at the transport's clean end. A failed transport raises an :class:`EdgeError` saying why."""
        raise NotImplementedError

    def started(self, start: StreamStart) -> None:
        """The stream's start message, parsed and matched to the plan (a source that also sends may need it)."""

    def close(self) -> None:
        """Stop receiving (idempotent)."""


def _reader(stream: BinaryIO, messages: queue.Queue, stop: threading.Event) -> None:
    """Move framed messages from ``stream`` to ``messages``; the last item is ``END`` or an :class:`EdgeError`.

    Whatever the stream raises ends up on the queue as an ``EdgeError``: the main thread waits on
    this queue and must always be told why the messages stopped (a reader that died silently hung it).
    """
    try:
        for item in read_records(stream):
            while not stop.is_set():
                try:
                    messages.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        item = END
    except EdgeError as exc:
        item = exc
    except OSError as exc:  # a file or pipe that fails under us
        item = ClientError(f"reading the stream failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a thread boundary: anything else would leave the main thread waiting forever
        item = ClientError(f"reading the stream failed unexpectedly: {type(exc).__name__}: {exc}")
    with contextlib.suppress(queue.Full):
        messages.put(item, timeout=1.0)


class RecordedMessages(MessageSource):
    """The messages of a byte stream (a recording, an HTTP body: magic, then kind, u32 length, payload each), read
    by a thread into a buffer of ``buffer_messages`` while the decoder works (a file or socket read blocks)."""

    framing_bytes = RECORD_HEADER.size

    def __init__(self, stream: BinaryIO, buffer_messages: int = 64) -> None:
        self.messages: queue.Queue = queue.Queue(maxsize=buffer_messages)
        self.stop = threading.Event()
        self.reader = threading.Thread(target=_reader, args=(stream, self.messages, self.stop), daemon=True)
        self.reader.start()

    def receive(self, idle_s: float | None) -> Any:
        """As :meth:`MessageSource.receive`; an error if the reader is gone without saying why (never a hang)."""
        waited = 0.0
        while True:
            wait = 0.5 if idle_s is None else min(0.5, idle_s - waited)
            try:
                item = self.messages.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if not self.reader.is_alive() and self.messages.empty():
                    raise ClientError("the stream reader stopped without a reason; the stream is incomplete") from None
                waited += wait
                if idle_s is not None and waited >= idle_s:
                    return IDLE
                continue
            if isinstance(item, Exception):
                raise item
            return item

    def close(self) -> None:
        self.stop.set()


class EdgeClient:
    """Decode one stream with ``plan``; audio goes to ``sinks`` (callables taking float32 PCM)."""

    def __init__(self, plan: ExecPlan, *, rknn_runtime: str = "auto", jitter_ms: float = 200.0, buffer_messages=64):
        self.plan = plan
        self.decoder = open_decoder(plan, rknn_runtime=rknn_runtime, check_sha256=False)  # load() checked them
        self.clock = PlaybackClock(jitter_ms / 1000.0)
        self.buffer_messages = buffer_messages

    def check_start(self, start: StreamStart) -> None:
        plan = self.plan
        if start.plan_id is not None and start.plan_id != plan.plan_id:
            raise ExecPlanError(
                f"the stream was made for plan {start.plan_id[:12]}, this client holds plan {plan.plan_id[:12]} "
                f"({plan.hardware_class}); fetch the server's plan (--plan URL)"
            )
        names = ("num_quantizers", "codebook_size", "sample_rate")
        wrong = {key: (have, want) for key, (want, have) in plan.codec.mismatches(start, names).items()}
        if not math.isclose(start.frame_rate, plan.codec.frame_rate, rel_tol=1e-6):
            wrong["frame_rate"] = (start.frame_rate, plan.codec.frame_rate)
        if wrong:
            details = ", ".join(f"{key}: stream {have}, plan {want}" for key, (have, want) in wrong.items())
            raise MalformedMessageError(f"the stream's geometry does not match the plan ({details})")

    def run(self, stream: BinaryIO | MessageSource, sinks: list) -> ClientReport:
        """Decode the messages of ``stream`` (a byte stream, or a :class:`MessageSource` such as a WebSocket's)."""
        report = ClientReport(plan_id=self.plan.plan_id)
        parser = CodecStreamParser()
        owned = not isinstance(stream, MessageSource)
        source = RecordedMessages(stream, self.buffer_messages) if owned else stream
        first_frames_at = None

        def emit(pcm: np.ndarray) -> None:
            nonlocal first_frames_at
            if not pcm.size:
                return
            now = time.perf_counter()
            if report.first_audio_seconds is None and first_frames_at is not None:
                report.first_audio_seconds = now - first_frames_at
            seconds = pcm.size / self.plan.codec.sample_rate
            report.audio_seconds += seconds
            self.clock.add(seconds, now)
            for sink in sinks:
                sink(pcm)

        def decode(call, *args) -> None:
            started = time.perf_counter()
            pcm = call(*args)
            report.decode_seconds += time.perf_counter() - started
            emit(pcm)

        try:
            drain = getattr(self.decoder, "drain", None)
            while True:
                pending = drain is not None and self.decoder.pending_frames > 0
                item = source.receive(DRAIN_AFTER_S if pending else None)
                if item is IDLE:  # frames come slower than real time: play what whole steps can decode now
                    decode(drain)
                    continue
                if item is END:
                    raise TruncatedStreamError(
                        f"the stream ended after {parser.frames_received} frames without a done message: the server "
                        "went away or the recording is cut off"
                    )
                kind, payload = item
                report.messages += 1
                report.stream_bytes += len(payload) + source.framing_bytes
                try:
                    event = parser.parse(kind, payload)
                except DuplicateMessageError:
                    report.duplicates += 1
                    continue
                if isinstance(event, StreamStart):
                    self.check_start(event)
                    source.started(event)
                elif isinstance(event, FrameBatch):
                    if first_frames_at is None:
                        first_frames_at = time.perf_counter()
                    if event.reset:
                        report.resets += 1
                        self.decoder.reset()
                    if len(event.frames):
                        decode(self.decoder.feed, event.frames)
                        report.frames += len(event.frames)
                    if event.segment_end or event.end_of_stream:
                        report.segments += 1
                        decode(self.decoder.flush)
                elif isinstance(event, StreamDone):
                    report.done_reason = event.reason
                    if event.reason == "error":
                        raise EdgeError(f"the server ended the stream with an error: {event.error}")
                    break
        except EdgeError as exc:
            report.error = str(exc)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by the command line: keep what we have
            report.error = "interrupted"
        except OSError as exc:  # a sink could not take the audio (disk full, closed pipe)
            report.error = f"writing the audio failed: {type(exc).__name__}: {exc}"
        finally:
            if owned:
                source.close()
            with contextlib.suppress(EdgeError, OSError):
                decode(self.decoder.flush)  # frames that arrived are real: their audio is kept
        report.underruns = self.clock.underruns
        if report.audio_seconds:
            report.real_time_factor = report.decode_seconds / report.audio_seconds
        return report
