"""Text written by an LLM while it is spoken: one streamed talker request vs sentence segments vs the whole text.

    .venv-vllm/bin/python -m benchmarks.bench_text_stream --out out/bench [--sizes tiny 0.6b] [--rates 5 15 50]
        [--sessions 1 4 8] [--max-frames N]
    .venv/bin/python -m benchmarks.bench_text_stream --out out/bench --plot-only   # table + PNG from the JSON

RANDOM WEIGHTS (``make_checkpoint --geometry small --talker SIZE``, written under ``--out``). For each talker
size, one ``vllm serve --omni --edge-hardware cpu_x86_64`` on 127.0.0.1 (``harness.vllm_server``). A
simulated LLM writes a fixed English paragraph as tokens at ``RATE`` tokens/s (a token: one token of the
talker's own text tokenizer, so the rate is the talker's text rate, which it consumes at 12.5 tokens/s;
``--piece-chars N`` cuts N-character pieces instead) into ``SESSIONS`` sessions at once, in three modes
measured in the same run:

* ``stream``: the WebSocket ``/v1/audio/speech/stream`` with ``"text_mode": "stream"``: every piece into one
  running talker request, one segment (a step whose text has not arrived is held);
* ``sentence``: the same WebSocket in today's default ``"text_mode": "sentence"``, the same pieces at the same
  times: each sentence its own request and segment, started once the sentence ends;
* ``whole``: ``POST /v1/audio/speech`` (``response_format: codec``) with the whole text, sent when the LLM
  writes its last token.

Each session is decoded as it arrives by the edge client (``EdgeClient(plan).run``, the ``cpu_x86_64`` plan
fetched from the server; this process runs onnxruntime only, the server is another process): stream and
sentence sessions through ``open_text_stream`` (the text written into a pipe as the LLM writes it), whole
text through ``open_speech_stream``. Greedy, a fixed frame budget: ``--max-frames`` for the utterance
(``stream``, ``whole``), split evenly over the sentences in ``sentence`` mode (random weights never sample
EOS: every request runs to its budget, so the three modes make the same number of frames).

Per session, from the LLM's first token: the first frame received, the first decoded sample, and the
speaker's stalls: playback modelled as 80 ms of audio per frame, starting once ``--jitter-ms`` of audio is
buffered after the first audio; every time the buffered audio runs out before more is decoded, the speaker
waits until ``--jitter-ms`` is buffered again (the client's ``PlaybackClock``, through ``harness.speaker``); the
stall time is the sum of those waits. Writes ``text_stream_SIZE.json`` per size, and ``text_stream.md`` and
``text_stream.png`` from every ``text_stream_*.json`` under ``--out``; prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.harness import (
    BenchmarkError,
    drain,
    ensure_checkpoint,
    number,
    plot,
    run_cli,
    speaker,
    table,
    vllm_server,
    write_json,
)
from vllm_omni.edge.client.session import END, IDLE, MessageSource, RecordedMessages
from vllm_omni.edge.stream import KIND_BINARY
from vllm_omni.edge.stream.messages import HEADER

TALKER_FRAME_RATE = 12.5  # frames per second of speech, one text token per talker step in the streamed layout
FRAME_SECONDS = 1 / TALKER_FRAME_RATE
HARDWARE = "cpu_x86_64"
MODES = ("stream", "sentence", "whole")
# Four sentences of about the same length (15-16 tokens each), in the words the random test tokenizer was trained
# on: about 3 characters per token there (a real Qwen2 tokenizer makes about 4-5 of English).
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    " She said she would be here by noon, and she was.",
    " Speak slowly, in a warm and friendly voice.",
    " She was here by noon, and the fox was happy.",
)
VOICE = {"voice": "Ryan", "language": "English"}


@dataclass(frozen=True)
class SizeSettings:
    max_frames: int  # the utterance's frame budget (about 3 frames per text token, as real speech)
    sentences: int  # how many of SENTENCES the LLM writes
    kv_cache: str
    start_timeout: float


SIZES = {
    "tiny": SizeSettings(max_frames=180, sentences=4, kv_cache="256M", start_timeout=900),
    # 28 layers x 2 x 8 KV heads x 128 x 4 B = 229 KB per token: 8 sessions of 1024 tokens in 2 GB
    "0.6b": SizeSettings(max_frames=40, sentences=2, kv_cache="2G", start_timeout=1800),
}


def paragraph_pieces(tokenizer_file: Path, sentences: int, piece_chars: int) -> tuple[str, list[str], int]:
    """The paragraph, the pieces the simulated LLM writes (its text, joined), and its count of talker text tokens."""
    from tokenizers import Tokenizer

    text = "".join(SENTENCES[:sentences])
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    starts = [start for start, _ in tokenizer.encode(text, add_special_tokens=False).offsets]
    if piece_chars > 0:
        starts = list(range(0, len(text), piece_chars))
    bounds = [*starts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    assert "".join(pieces) == text
    return text, pieces, len(tokenizer.encode(text, add_special_tokens=False).ids)


def commit_schedule(checkpoint: Path, pieces: list[str]) -> list[int]:
    """The talker text tokens the server has committed after each piece (its ``IncrementalTokenizer``: a word is
    committed once the next one starts), and after the end of the text (the last item). Run in a child process:
    the tokenizer's module imports torch, which this process keeps out (it times onnxruntime)."""
    result = subprocess.run(
        [sys.executable, "-m", __spec__.name, "--commit-schedule", str(checkpoint)],
        input=json.dumps(pieces), capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


def print_commit_schedule(checkpoint: str) -> None:
    from transformers import AutoTokenizer

    from vllm_omni.model_executor.models.qwen3_tts.text_stream import IncrementalTokenizer

    tokens = IncrementalTokenizer(AutoTokenizer.from_pretrained(checkpoint))
    counts = []
    for piece in json.loads(sys.stdin.read()):
        tokens.add(piece)
        counts.append(len(tokens.text_ids))
    tokens.finish()
    print(json.dumps([*counts, len(tokens.text_ids)]))


def frame_lags(frames_at: list, pieces_at: list[float], commits: list[int]) -> list[float]:
    """Stream mode: per frame that reads text committed before the end of the text, its arrival minus the time the
    last text token it reads was committed on the server: frame ``k`` (1-based) is made from the talker's state
    after text tokens ``1..k`` (the first is in the prompt), so it can leave once ``k`` tokens are committed. (Up
    to 2026-12 the server sent frame ``k`` with talker step ``k + 1``, one text token later: this lag shows it.)
    Frames after the end of the text are left out (they wait for the engine, not for text)."""
    ready = list(zip(commits[:-1], pieces_at, strict=False))  # before the end of the text
    lags, index = [], 0
    for arrived, count in frames_at:
        for _ in range(count):
            index += 1
            needed = next((sent for committed, sent in ready if committed >= index), None)
            if needed is not None:
                lags.append(arrived - needed)
    return lags


class TimedMessages(MessageSource):
    """The session's message source, passed through unchanged, remembering when each frames message arrived.

    A thread of its own takes the messages from the source as the transport delivers them (a WebSocket's
    :class:`~vllm_omni.edge.client.text_socket.SocketMessages`, or an HTTP body read by the client's
    :class:`~vllm_omni.edge.client.session.RecordedMessages`) and stamps them then, so an arrival is the server's
    time, not the moment the decoder loop got round to the message; the session takes them in order."""

    def __init__(self, source) -> None:
        self.source = source if isinstance(source, MessageSource) else RecordedMessages(source)
        self.framing_bytes = self.source.framing_bytes
        self.arrivals: list[tuple[float, int]] = []  # (when, frames) of every frames message that carried frames
        self.items: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        while not self.stop.is_set():
            try:
                item = self.source.receive(0.5)
            except Exception as error:  # the transport's error, handed to the session after what came before it
                self.items.put(error)
                return
            if item is IDLE:
                continue
            if isinstance(item, tuple) and item[0] == KIND_BINARY and len(item[1]) >= HEADER.size:
                count = HEADER.unpack_from(item[1])[2]  # the frames message's count (the parser checks the rest)
                if count:
                    self.arrivals.append((time.perf_counter(), count))
            self.items.put(item)
            if item is END:
                return

    def receive(self, idle_s):
        try:
            item = self.items.get(timeout=idle_s)
        except queue.Empty:
            return IDLE
        if isinstance(item, Exception):
            raise item
        return item

    def started(self, start) -> None:
        self.source.started(start)

    def close(self) -> None:
        self.stop.set()
        self.source.close()
        self.pump.join(timeout=5)

    def frame_arrivals(self) -> list[tuple[float, int]]:
        """``(time, frames)`` of every frames message that carried frames, when the transport delivered it."""
        return self.arrivals


@dataclass
class Session:
    """One simulated LLM and the device that speaks what it writes."""

    mode: str
    client: object  # EdgeClient, made before the clock starts
    stream: object = None  # the opened stream (TimedMessages)
    write_fd: int | None = None  # stream/sentence: the pipe the LLM writes into
    read_file: object = None
    pieces_sent: int = 0
    first_piece_at: float | None = None
    last_piece_at: float | None = None
    audio: list[tuple[float, int]] = field(default_factory=list)  # (when, samples) per decoded chunk
    report: object = None
    error: str | None = None
    piece_times: list[float] = field(default_factory=list)
    writer: threading.Thread | None = None


def open_session(mode: str, server: str, plan, body: dict, jitter_ms: float, timeout: float) -> Session:
    """The device's client; for the WebSocket modes, the session opened (start sent) and fed from a pipe."""
    from vllm_omni.edge.client import EdgeClient
    from vllm_omni.edge.client.text_socket import open_text_stream

    session = Session(mode, EdgeClient(plan, jitter_ms=jitter_ms))
    if mode != "whole":
        read_fd, session.write_fd = os.pipe()
        session.read_file = open(read_fd, "rb", buffering=0)  # noqa: SIM115 (closed after the run)
        socket_body = {**body, "text_mode": mode}  # open_text_stream's start message takes the body's text_mode
        session.stream = TimedMessages(open_text_stream(server, socket_body, session.read_file, None, timeout))
    return session


def run_session(
    session: Session, server: str, body: dict, text: str, pieces: list[str], rate: float, t0: float, timeout: float
) -> None:
    """The LLM writes ``pieces`` from ``t0`` at ``rate`` (stream/sentence: into the session's pipe, a thread of its
    own; whole: the text posted after the last piece); the device decodes what comes back."""
    from vllm_omni.edge.client.server import open_speech_stream

    def write() -> None:
        try:
            for index, piece in enumerate(pieces):
                delay = t0 + index / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                now = time.perf_counter()
                if session.write_fd is not None:
                    os.write(session.write_fd, piece.encode())
                session.piece_times.append(now - t0)
                session.first_piece_at = session.first_piece_at or now
                session.last_piece_at = now
                session.pieces_sent += 1
        except OSError as error:  # the pipe closed under us (the run timed out)
            session.error = session.error or f"writing the text failed: {error}"
        finally:
            if session.write_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(session.write_fd)  # end of text: the client sends `end`
                session.write_fd = None

    def sink(pcm: np.ndarray) -> None:
        session.audio.append((time.perf_counter(), pcm.size))

    try:
        if session.mode == "whole":
            write()  # the LLM writes; the whole text is posted after its last token
            session.stream = TimedMessages(open_speech_stream(server, {**body, "input": text}, timeout))
        else:
            session.writer = threading.Thread(target=write, daemon=True)
            session.writer.start()
        session.report = session.client.run(session.stream, [sink])
    except Exception as error:  # a session that could not run: reported, the benchmark goes on
        session.error = f"{type(error).__name__}: {error}"


def session_result(session: Session, t0: float, samples_per_frame: int, jitter_s: float, commits: list[int]) -> dict:
    arrivals = session.stream.frame_arrivals() if session.stream is not None else []
    audio = [(when, samples / samples_per_frame * FRAME_SECONDS) for when, samples in session.audio if samples]
    played = speaker(audio, jitter_s)
    # the same speaker fed each frame as it arrives (a decoder that steps every frame): the server's part
    wire = speaker([(when, count * FRAME_SECONDS) for when, count in arrivals], jitter_s)
    report = session.report
    frames_at = [[when - t0, count] for when, count in arrivals]
    lags = frame_lags(frames_at, session.piece_times, commits) if session.mode == "stream" else []

    def since(when: float | None) -> float | None:
        return None if when is None else when - t0

    error = session.error or (report.error if report is not None else "no report")
    return {
        "first_frame_s": since(arrivals[0][0]) if arrivals else None,
        "first_audio_s": since(audio[0][0]) if audio else None,
        "playback_start_s": since(played["start"]),
        "playback_end_s": since(played["end"]),
        "stall_s": played["stall_s"],
        "stalls": played["stalls"],
        "longest_stall_s": played["longest_stall_s"],
        "wire_stall_s": wire["stall_s"],
        "wire_stalls": wire["stalls"],
        "frame_lag_p50_s": float(np.median(lags)) if lags else None,
        "frame_lag_max_s": float(max(lags)) if lags else None,
        "frames": int(sum(count for _, count in arrivals)),
        "decoded_frames": report.frames if report is not None else 0,
        "audio_s": float(sum(seconds for _, seconds in audio)),
        "segments": report.segments if report is not None else 0,
        "text_first_s": since(session.first_piece_at),
        "text_last_s": since(session.last_piece_at),
        "pieces_sent": session.pieces_sent,
        "last_frame_s": since(arrivals[-1][0]) if arrivals else None,
        "done_reason": report.done_reason if report is not None else None,
        "decode_rtf": report.real_time_factor if report is not None else None,
        "error": error,
        # the timeline of this session: frames received and audio decoded (cumulative seconds of speech)
        "frames_at": [[round(since(when), 4), count] for when, count in arrivals],
        "audio_at": [[round(since(when), 4), round(seconds, 4)] for when, seconds in audio],
        "playing": [[round(since(a), 4), round(since(b), 4)] for a, b in played["playing"]],
        "pieces_at": [round(t, 4) for t in session.piece_times],
    }


def run_config(url: str, plan, settings: dict, mode: str, rate: float, sessions: int, args, label: str) -> list:
    """``sessions`` simulated LLMs at ``rate`` in ``mode``, all starting together; their results."""
    text, pieces = settings["text"], settings["pieces"]
    budget = settings["sentence_max_frames"] if mode == "sentence" else settings["max_frames"]
    body = {**VOICE, "greedy": True, "max_frames": budget, "edge_hardware": HARDWARE}
    timeout = args.network_timeout
    clients = [open_session(mode, url, plan, body, args.jitter_ms, timeout) for _ in range(sessions)]
    text_s = (len(pieces) - 1) / rate
    # generous (a shared 2-core machine): the text's time, then every session's frames at 1 frame/s together, 2 min
    limit_s = text_s + settings["max_frames"] * sessions + 120
    t0 = time.perf_counter() + 0.2
    threads = [
        threading.Thread(
            target=run_session, args=(s, url, body, text, pieces, rate, t0, timeout), name=f"session-{i}", daemon=True
        )
        for i, s in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    next_report = time.perf_counter() + args.progress_s
    while any(thread.is_alive() for thread in threads):
        now = time.perf_counter()
        if now - t0 > limit_s:
            print(f"[bench]   {label}: over {limit_s:.0f} s, closing the sessions", flush=True)
            for session in clients:
                session.error = session.error or f"timed out after {limit_s:.0f} s"
                if session.stream is not None:
                    with contextlib.suppress(Exception):
                        session.stream.close()
            for thread in threads:
                thread.join(timeout=30)
            break
        if now >= next_report:
            frames = [sum(n for _, n in s.audio) for s in clients]
            spf = plan.codec.samples_per_frame
            print(
                f"[bench]   {label}: {now - t0:.0f} s, text {np.mean([s.pieces_sent for s in clients]):.0f}/"
                f"{len(pieces)} pieces, decoded {np.mean(frames) / spf:.0f}/{settings['max_frames']} frames "
                "(mean per session)",
                flush=True,
            )
            next_report = now + args.progress_s
        time.sleep(0.1)
    for session in clients:  # the writer closes its end of the pipe (the one thread that does)
        if session.writer is not None:
            session.writer.join(timeout=max(0.0, t0 + text_s - time.perf_counter()) + 10)
        if session.read_file is not None and (session.writer is None or not session.writer.is_alive()):
            session.read_file.close()  # the client's sender has read the end of the text

    spf, jitter_s = plan.codec.samples_per_frame, args.jitter_ms / 1000
    results = [session_result(s, t0, spf, jitter_s, settings["commits"]) for s in clients]
    if drain(url) is None:
        print(f"[bench]   {label}: the engine still runs requests 60 s after the run", flush=True)
    return results


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def largest(values) -> float | None:
    return max((v for v in values if v is not None), default=None)


def summary(streams: list[dict]) -> dict:
    return {
        "first_frame_s": mean(s["first_frame_s"] for s in streams),
        "first_audio_s": mean(s["first_audio_s"] for s in streams),
        "first_audio_max_s": largest(s["first_audio_s"] for s in streams),
        "playback_start_s": mean(s["playback_start_s"] for s in streams),
        "stall_s": mean(s["stall_s"] for s in streams),
        "stall_max_s": max(s["stall_s"] for s in streams),
        "stalls": mean(s["stalls"] for s in streams),
        "longest_stall_s": max(s["longest_stall_s"] for s in streams),
        "wire_stall_s": mean(s["wire_stall_s"] for s in streams),
        "wire_stalls": mean(s["wire_stalls"] for s in streams),
        "frame_lag_p50_s": mean(s["frame_lag_p50_s"] for s in streams),
        "frame_lag_max_s": largest(s["frame_lag_max_s"] for s in streams),
        "frames": mean(s["frames"] for s in streams),
        "text_last_s": mean(s["text_last_s"] for s in streams),
        "last_frame_s": mean(s["last_frame_s"] for s in streams),
        "playback_end_s": mean(s["playback_end_s"] for s in streams),
        "errors": [s["error"] for s in streams if s["error"]],
    }


def bench_size(size: str, args) -> Path:
    from vllm_omni.edge.client import fetch_plan
    from vllm_omni.edge.client.server import plan_url

    defaults = SIZES[size]
    max_frames = args.max_frames or defaults.max_frames
    sentences = args.sentences or defaults.sentences
    work = args.out / "text_stream" / size
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_checkpoint(work / "ckpt", "small", talker=size)  # written in a child: no torch here
    text, pieces, tokens = paragraph_pieces(checkpoint / "tokenizer.json", sentences, args.piece_chars)
    commits = commit_schedule(checkpoint, pieces)
    settings = {
        "commits": commits,
        "text": text,
        "pieces": pieces,
        "max_frames": max_frames,
        "sentence_max_frames": max_frames // sentences,
    }
    print(
        f"[bench] {size}: {len(text)} characters, {tokens} talker text tokens, {len(pieces)} pieces; "
        f"{max_frames} frames ({settings['sentence_max_frames']} per sentence in sentence mode); starting the "
        "server ...",
        flush=True,
    )
    started = time.monotonic()
    server = vllm_server(
        checkpoint, work / "artifacts", work / "server.log", kv_cache=defaults.kv_cache,
        start_timeout=defaults.start_timeout,
    )  # fmt: skip
    rows = []
    with server as running:
        url = running.url
        print(f"[bench] {size}: server up in {time.monotonic() - started:.0f} s at {url}", flush=True)
        plan = fetch_plan(plan_url(url, HARDWARE), work / "client_cache", timeout=args.network_timeout)
        print(f"[bench] {size}: warm-up (a short streamed and a short whole-text utterance) ...", flush=True)
        warm = {**settings, "pieces": pieces[:4], "text": "".join(pieces[:4]), "max_frames": 4, "commits": [0]}
        for mode in ("stream", "whole"):
            run_config(url, plan, warm, mode, 50.0, 1, args, f"{size} warm-up {mode}")
        for sessions in args.sessions:
            for rate in args.rates:
                for mode in args.modes:
                    label = f"{size} {mode} x{sessions} @ {rate:g} tok/s (load {os.getloadavg()[0]:.1f})"
                    print(f"[bench] {label} ...", flush=True)
                    streams = run_config(url, plan, settings, mode, rate, sessions, args, label)
                    row = {"size": size, "rate": rate, "sessions": sessions, "mode": mode, "streams": streams}
                    row["load_average_1m"] = os.getloadavg()[0]  # this machine is shared: what else ran
                    row["summary"] = summary(streams)
                    rows.append(row)
                    s = row["summary"]
                    print(
                        f"[bench]   first frame {number(s['first_frame_s'])} s, "
                        f"first audio {number(s['first_audio_s'])} s, stall {number(s['stall_s'])} s in "
                        f"{number(s['stalls'], 1)} stalls, {number(s['frames'], 0)} frames"
                        + (f"; ERRORS: {s['errors'][:2]}" if s["errors"] else ""),
                        flush=True,
                    )
    report = {
        "random_weights": True,
        "size": size,
        "decoder_geometry": "small",
        "hardware": HARDWARE,
        "text": text,
        "pieces": len(pieces),
        "piece_chars": args.piece_chars or None,
        "text_tokens": tokens,
        "sentences": sentences,
        "max_frames": max_frames,
        "sentence_max_frames": settings["sentence_max_frames"],
        "jitter_ms": args.jitter_ms,
        "voice": VOICE,
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    return write_json(args.out / f"text_stream_{size}.json", report, indent=1)


def report_table(reports: list[dict]) -> str:
    headers = ("tok/s", "sessions", "mode", "LLM done", "first frame", "first audio", "playback starts", "stall (max)")
    headers += ("stalls", "longest stall", "stall if decoded per frame", "frame lag p50 / max", "frames", "last frame")
    lines = []
    for report in reports:
        rows = []
        for row in report["rows"]:
            s = row["summary"]
            errors = f" ({len(s['errors'])} failed)" if s["errors"] else ""
            lag = None if s["frame_lag_p50_s"] is None else f"{s['frame_lag_p50_s']:.2f} / {s['frame_lag_max_s']:.2f}"
            rows.append(
                (
                    f"{row['rate']:g}", row["sessions"], f"{row['mode']}{errors}", number(s["text_last_s"], 1),
                    number(s["first_frame_s"]), number(s["first_audio_s"]), number(s["playback_start_s"]),
                    f"{number(s['stall_s'])} ({number(s['stall_max_s'])})", number(s["stalls"], 1),
                    number(s["longest_stall_s"]), f"{number(s['wire_stall_s'])} in {number(s['wire_stalls'], 1)}",
                    lag, number(s["frames"], 0), number(s["last_frame_s"], 1),
                )
            )  # fmt: skip
        lines += [
            f"**{report['size']} talker**, small decoder geometry, RANDOM WEIGHTS; {report['text_tokens']} talker text "
            f"tokens ({len(report['text'])} characters, {report['sentences']} sentences) written as "
            f"{report['pieces']} pieces; {report['max_frames']} frames per utterance (sentence mode: "
            f"{report['sentence_max_frames']} per sentence); greedy; jitter buffer {report['jitter_ms']:g} ms. "
            "Times in seconds from the LLM's first token, means over the sessions (max in brackets).",
            "",
            table(headers, rows, align="rrl" + "r" * 11),
            "",
        ]
    return "\n".join(lines)


def draw(pyplot, reports: list[dict]):
    colors = {"stream": "tab:blue", "sentence": "tab:orange", "whole": "tab:green"}
    markers = {1: "o", 4: "s", 8: "^"}
    figure, axes = pyplot.subplots(len(reports), 3, figsize=(15, 4 * len(reports)), squeeze=False)
    for (first, stall, timeline), report in zip(axes, reports, strict=True):
        rows = report["rows"]
        for mode in MODES:
            for sessions in sorted({r["sessions"] for r in rows}):
                chosen = sorted((r for r in rows if r["mode"] == mode and r["sessions"] == sessions),
                                key=lambda r: r["rate"])  # fmt: skip
                if not chosen:
                    continue
                rates = [r["rate"] for r in chosen]
                style = {"color": colors[mode], "marker": markers.get(sessions, "x"), "alpha": 0.85}
                label = f"{mode} x{sessions}"
                first.plot(rates, [r["summary"]["first_audio_s"] for r in chosen], label=label, **style)
                stall.plot(rates, [r["summary"]["stall_s"] for r in chosen], label=label, **style)
        rates = sorted({r["rate"] for r in rows})
        for axis, what in ((first, "first audio (s from the LLM's first token)"), (stall, "stall time (s)")):
            axis.set_xscale("log")
            axis.set_xticks(rates, [f"{r:g}" for r in rates])
            axis.minorticks_off()
            axis.set_xlabel("LLM tokens/s")
            axis.set_ylabel(what)
            axis.grid(alpha=0.3)
        first.set_title(f"{report['size']} talker: first audio")
        stall.set_title(f"{report['size']}: speaker stalls ({report['jitter_ms']:g} ms jitter buffer)")
        stall.legend(fontsize=7, ncol=3)
        slowest = min(r["rate"] for r in rows)
        for mode in MODES:
            chosen = [r for r in rows if r["mode"] == mode and r["rate"] == slowest and r["sessions"] == 1]
            if not chosen:
                continue
            stream = chosen[0]["streams"][0]
            times = [t for t, _ in stream["audio_at"]]
            timeline.step(times, np.cumsum([s for _, s in stream["audio_at"]]), where="post", color=colors[mode],
                          label=f"{mode}: audio decoded")  # fmt: skip
            played, xs, ys = 0.0, [], []
            for begin, end in stream["playing"]:  # the speaker: flat while it waits for audio
                xs += [begin, end]
                ys += [played, played + end - begin]
                played += end - begin
            timeline.plot(xs, ys, color=colors[mode], linestyle=":", label=f"{mode}: played")
        pieces = rows[0]["streams"][0]["pieces_at"] if rows else []
        if pieces:
            timeline.axvline(pieces[-1], color="gray", linestyle="--", linewidth=1, label="LLM done")
        timeline.set_xlabel("s from the LLM's first token")
        timeline.set_ylabel("speech decoded on the device (s)")
        timeline.set_title(f"{report['size']}: one session at {slowest:g} tok/s")
        timeline.grid(alpha=0.3)
        timeline.legend(fontsize=7)
    figure.suptitle("Text streamed while spoken (RANDOM WEIGHTS, small decoder, cpu_x86_64 plan, 2-core loopback)")
    return figure


def write_outputs(out: Path) -> None:
    paths = sorted(out.glob("text_stream_*.json"))
    if not paths:
        raise BenchmarkError(f"no text_stream_*.json under {out}")
    order = {size: index for index, size in enumerate(SIZES)}
    reports = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: order.get(r["size"], 99))
    for report in reports:
        for row in report["rows"]:
            row["summary"] = summary(row["streams"])  # from the sessions, as this version summarizes them
    text = report_table(reports)
    (out / "text_stream.md").write_text(text)
    print("\n" + text)
    print(f"[bench] from {', '.join(p.name for p in paths)} -> {out / 'text_stream.md'}", flush=True)
    if plot(out / "text_stream.png", lambda pyplot: draw(pyplot, reports), dpi=80):
        print(f"[bench] -> {out / 'text_stream.png'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/bench"))
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tiny"])
    parser.add_argument("--rates", type=float, nargs="+", default=[5, 15, 50], help="LLM tokens per second")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8], help="concurrent sessions")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="what to measure")
    parser.add_argument("--max-frames", type=int, help="frames per utterance (default: tiny 180, 0.6b 40)")
    parser.add_argument("--sentences", type=int, choices=range(1, len(SENTENCES) + 1),
                        help="sentences of the paragraph the LLM writes (default: tiny 4, 0.6b 2)")  # fmt: skip
    parser.add_argument("--piece-chars", type=int, default=0, help="N-character pieces (0: the talker's tokens)")
    parser.add_argument("--jitter-ms", type=float, default=200.0, help="audio buffered before playback starts")
    parser.add_argument("--network-timeout", type=float, default=120.0, help="seconds any network wait may take")
    parser.add_argument("--progress-s", type=float, default=10.0, help="a progress line this often during a run")
    parser.add_argument("--plot-only", action="store_true", help="the table and PNG from the JSON files under --out")
    parser.add_argument("--commit-schedule", metavar="CHECKPOINT", help=argparse.SUPPRESS)  # commit_schedule's child
    args = parser.parse_args()
    if args.commit_schedule:
        print_commit_schedule(args.commit_schedule)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.plot_only:
        for size in args.sizes:
            path = bench_size(size, args)
            print(f"[bench] {size}: -> {path}", flush=True)
    write_outputs(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
