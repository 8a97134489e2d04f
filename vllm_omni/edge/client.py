"""The edge client: a codec-token stream in, audio out, decoded on this device with an execution plan.

    python -m vllm_omni.edge.client --stream URL_OR_FILE --plan DIR_OR_URL [--out speech.wav] [--pcm-stdout]

``--stream`` is an ``http(s)://`` URL (the server's stream: framed messages in the response
body), a recorded stream file, or ``-`` for stdin. ``--plan`` is a plan directory or the URL of
one (``.../exec_plan.json`` or its directory); a URL's artifacts are downloaded once into
``--cache-dir`` and each checked against its sha256. The start message must name the same plan
(``plan_id``) and geometry as the plan the client holds.

A reader thread takes messages off the wire into a small buffer while the decoder works;
playback is modelled with a jitter buffer of ``--jitter-ms`` of audio, and every time the audio
would have run dry an underrun is counted. ``reset`` drops the decoder's state and any frames not
yet decoded; ``segment end`` and ``end of stream`` flush it. A duplicate message is skipped and
counted; any other protocol error, a cut-off stream or a disconnect ends the run with one
``error:`` line, and the audio decoded up to then is flushed and left intact in ``--out``.
At the end it prints first-audio latency, real-time factor, underruns and bytes.
Exit codes: 0 complete (or cancelled by the server), 1 a stream or plan error, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .audio import WavWriter, float_to_pcm16
from .codec_stream import (
    CodecStreamError,
    CodecStreamParser,
    DuplicateMessageError,
    FrameBatch,
    MalformedMessageError,
    StreamDone,
    StreamStart,
    TruncatedStreamError,
    read_records,
)
from .errors import EdgeError
from .files import file_matches, file_sha256, write_atomically
from .plan import PLAN_NAME, ExecPlan, ExecPlanError

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vllm-omni-edge" / "plans"
NETWORK_TIMEOUT_S = 30.0


# -- where streams and plans come from --------------------------------------------------------------


def _is_url(location: str) -> bool:
    return urllib.parse.urlparse(location).scheme in ("http", "https")


def open_stream(location: str) -> BinaryIO:
    """A readable byte stream: ``-`` (stdin), an ``http(s)://`` URL, or a recorded file."""
    if location == "-":
        return sys.stdin.buffer
    if _is_url(location):
        try:
            return urllib.request.urlopen(location, timeout=NETWORK_TIMEOUT_S)
        except OSError as exc:
            raise EdgeError(f"cannot open the stream {location}: {exc}") from exc
    path = Path(location)
    if not path.is_file():
        raise EdgeError(f"no stream recording at {path}")
    return open(path, "rb")


def _download(url: str, destination: Path, sha256: str | None = None) -> None:
    def write(temporary: Path) -> None:
        try:
            with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as response, open(temporary, "wb") as out:
                while block := response.read(1 << 20):
                    out.write(block)
        except OSError as exc:
            raise EdgeError(f"cannot download {url}: {exc}") from exc
        if sha256 is not None and file_sha256(temporary) != sha256:
            raise ExecPlanError(f"{url}: the download does not hash to the plan's sha256 {sha256[:16]}...; not kept")

    destination.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(destination, write)


def fetch_plan(location: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> ExecPlan:
    """A validated plan from a directory, a plan file, or a URL (artifacts downloaded once, sha256-checked)."""
    if not _is_url(location):
        return ExecPlan.load(location)
    plan_url = location if location.endswith(".json") else location.rstrip("/") + "/" + PLAN_NAME
    base = plan_url.rsplit("/", 1)[0] + "/"
    staging = cache_dir / ".incoming" / PLAN_NAME
    _download(plan_url, staging)
    try:
        payload = json.loads(staging.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExecPlanError(f"{plan_url} is not a JSON plan ({exc})") from exc
    plan = ExecPlan.from_json(payload, source=plan_url)
    directory = cache_dir / plan.plan_id
    files = [(a.file, a.sha256, a.size_bytes) for a in plan.artifacts.values()]
    files += [
        (a.source["file"], a.source["sha256"], a.source["size_bytes"]) for a in plan.artifacts.values() if a.source
    ]
    for name, sha256, size in files:
        target = directory / name
        if file_matches(target, size, sha256):
            continue
        _download(urllib.parse.urljoin(base, urllib.parse.quote(name)), target, sha256)
    staging.replace(directory / PLAN_NAME)
    return ExecPlan.load(directory)


# -- playback model --------------------------------------------------------------------------------


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


# -- the client ------------------------------------------------------------------------------------


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


_END = object()


def _reader(stream: BinaryIO, messages: queue.Queue, stop: threading.Event) -> None:
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
        messages.put(_END)
    except (CodecStreamError, OSError) as exc:
        messages.put(exc)


class EdgeClient:
    """Decode one stream with ``plan``; audio goes to ``sinks`` (callables taking float32 PCM)."""

    def __init__(self, plan: ExecPlan, *, rknn_runtime: str = "auto", jitter_ms: float = 200.0, buffer_messages=64):
        from .runtime.plan_decoder import open_decoder

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
        wanted = {
            "num_quantizers": plan.num_quantizers,
            "codebook_size": plan.codebook_size,
            "sample_rate": plan.sample_rate,
        }
        wrong = {key: (getattr(start, key), value) for key, value in wanted.items() if getattr(start, key) != value}
        if wrong:
            details = ", ".join(f"{key}: stream {have}, plan {want}" for key, (have, want) in wrong.items())
            raise MalformedMessageError(f"the stream's geometry does not match the plan ({details})")

    def run(self, stream: BinaryIO, sinks: list) -> ClientReport:
        report = ClientReport(plan_id=self.plan.plan_id)
        parser = CodecStreamParser()
        messages: queue.Queue = queue.Queue(maxsize=self.buffer_messages)
        stop = threading.Event()
        reader = threading.Thread(target=_reader, args=(stream, messages, stop), daemon=True)
        first_frames_at = None
        reader.start()

        def emit(pcm: np.ndarray) -> None:
            nonlocal first_frames_at
            if not pcm.size:
                return
            now = time.perf_counter()
            if report.first_audio_seconds is None and first_frames_at is not None:
                report.first_audio_seconds = now - first_frames_at
            seconds = pcm.size / self.plan.sample_rate
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
            while True:
                item = messages.get()
                if item is _END:
                    raise TruncatedStreamError(
                        f"the stream ended after {parser.frames_received} frames without a done message: the server "
                        "went away or the recording is cut off"
                    )
                if isinstance(item, Exception):
                    raise item
                kind, payload = item
                report.messages += 1
                report.stream_bytes += len(payload) + 5
                try:
                    event = parser.parse(kind, payload)
                except DuplicateMessageError:
                    report.duplicates += 1
                    continue
                if isinstance(event, StreamStart):
                    self.check_start(event)
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
        finally:
            stop.set()
            with contextlib.suppress(EdgeError):
                decode(self.decoder.flush)  # frames that arrived are real: their audio is kept
        report.underruns = self.clock.underruns
        if report.audio_seconds:
            report.real_time_factor = report.decode_seconds / report.audio_seconds
        return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni.edge.client", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", required=True, help="http(s) URL, recorded stream file, or - for stdin")
    parser.add_argument("--plan", required=True, help="plan directory, exec_plan.json, or the URL of either")
    parser.add_argument("--out", type=Path, help="write a 16-bit WAV here")
    parser.add_argument("--pcm-stdout", action="store_true", help="write raw s16le mono PCM to stdout as it decodes")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="where downloaded plans are kept")
    parser.add_argument("--jitter-ms", type=float, default=200.0, help="audio buffered before playback starts")
    parser.add_argument("--rknn-runtime", default="auto", choices=("auto", "board", "simulator"))
    parser.add_argument("--report", type=Path, help="write the run's numbers as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is None and not args.pcm_stdout:
        print("error: nothing to write: give --out FILE.wav and/or --pcm-stdout", file=sys.stderr)
        return 2
    try:
        plan = fetch_plan(args.plan, args.cache_dir)
        client = EdgeClient(plan, rknn_runtime=args.rknn_runtime, jitter_ms=args.jitter_ms)
        stream = open_stream(args.stream)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sinks, wav = [], None
    if args.out is not None:
        wav = WavWriter(args.out, plan.sample_rate)
        sinks.append(wav.write)
    if args.pcm_stdout:
        sinks.append(lambda pcm: (sys.stdout.buffer.write(float_to_pcm16(pcm).tobytes()), sys.stdout.buffer.flush()))
    try:
        report = client.run(stream, sinks)
    finally:
        stream.close()
        if wav is not None:
            report_wav = wav.close()
    if wav is not None:
        report.wav = str(report_wav)
    print(f"[client] plan {plan.plan_id[:12]} ({plan.hardware_class}): {report.summary()}", file=sys.stderr)
    if args.report:
        args.report.write_text(json.dumps(asdict(report), indent=2))
    if report.error:
        kept = f"; the audio decoded so far ({report.audio_seconds:.2f} s) is in {report.wav}" if report.wav else ""
        print(f"error: {report.error}{kept}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
