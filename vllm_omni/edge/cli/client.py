"""The edge client: a codec-token stream in, audio out, decoded on this device with an execution plan.

    python -m vllm_omni.edge client --stream URL_OR_FILE --plan DIR_OR_URL [--out speech.wav] [--pcm-stdout]
    python -m vllm_omni.edge client --server http://HOST:PORT --hardware CLASS --text "..." --voice Ryan \
        [--api-key KEY] --out speech.wav
    some-llm ... | python -m vllm_omni.edge client --server URL --hardware CLASS --text-stdin --voice Ryan --out a.wav

With ``--server`` (a ``vllm serve --omni`` server) the client takes the plan of ``--hardware`` from
the server (downloading or reusing its artifacts), sends the text as a speech request
(``response_format: codec``) and decodes the stream it answers with, all locally. With ``--text-stdin`` the
text is whatever arrives on standard input, sent piece by piece as it arrives into one utterance over the
server's WebSocket (``"text_mode": "stream"``): speech starts after the first words, and audio plays as frames
come (``vllm_omni.edge.client.text_socket``).

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
Exit codes: 0 complete (or cancelled by the server), 1 a stream, plan or network error (or an
interruption), 2 bad arguments. Failure behaviour: docs/development.md, "Failure behaviour".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..audio import WavWriter, float_to_pcm16
from ..client import DEFAULT_CACHE_DIR, EdgeClient, fetch_plan, open_stream
from ..client.server import open_speech_stream, plan_url, use_api_key
from ..client.text_socket import open_text_stream
from ..client.transport import NETWORK_TIMEOUT_S
from ..errors import EdgeError
from ..files import directory_problem


def build_parser(prog: str = "vllm-omni-edge client") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", help="http(s) URL, recorded stream file, or - for stdin")
    parser.add_argument("--plan", help="plan directory, exec_plan.json, or the URL of either")
    server = parser.add_argument_group("from a server (vllm serve --omni): plan, artifacts and stream")
    server.add_argument("--server", help="the server's base URL, e.g. http://127.0.0.1:8000")
    server.add_argument("--hardware", help="the hardware class whose plan this device runs")
    server.add_argument("--text", help="what to say")
    server.add_argument(
        "--text-stdin",
        action="store_true",
        help="say what arrives on standard input as it arrives (an LLM piped in): one utterance, spoken from its "
        "first words, over the server's WebSocket (text_mode stream); it ends at end of input",
    )
    server.add_argument("--voice", help="speaker (CustomVoice checkpoints)")
    server.add_argument("--language", help="language or Auto")
    server.add_argument("--instructions", help="style instruction, or the voice description (VoiceDesign)")
    server.add_argument("--max-frames", type=int, help="frames at most (12.5 per second of speech)")
    server.add_argument("--greedy", action="store_true", help="argmax decoding (reproducible)")
    server.add_argument("--seed", type=int, help="sampling seed")
    server.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: $VLLM_API_KEY")
    parser.add_argument("--out", type=Path, help="write a 16-bit WAV here")
    parser.add_argument("--pcm-stdout", action="store_true", help="write raw s16le mono PCM to stdout as it decodes")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="where downloaded plans are kept")
    parser.add_argument("--jitter-ms", type=float, default=200.0, help="audio buffered before playback starts")
    parser.add_argument("--rknn-runtime", default="auto", choices=("auto", "board", "simulator"))
    parser.add_argument("--report", type=Path, help="write the run's numbers as JSON here")
    parser.add_argument(
        "--timeout", type=float, default=NETWORK_TIMEOUT_S, help="seconds any network read may wait (default 30)"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing --out / --report that is not a WAV / JSON report"
    )
    return parser


def _looks_like(path: Path, kind: str) -> bool:
    """Whether the existing file at ``path`` is a WAV (``kind`` wav) or a JSON object (``kind`` json)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(12)
    except OSError:
        return False
    if kind == "wav":
        return head[:4] == b"RIFF" and head[8:12] == b"WAVE"
    return head.lstrip()[:1] == b"{"


def _same_file(first: Path, second: Path) -> bool:
    try:
        return first.exists() and second.exists() and first.samefile(second)
    except OSError:
        return False


def check_outputs(args: argparse.Namespace) -> str | None:
    """Why ``--out`` / ``--report`` cannot be written (checked before any decoding), or ``None``."""
    sources = (args.stream, args.plan)
    inputs = [Path(location) for location in sources if location and location != "-" and "://" not in location]
    named = (("--out", args.out, "wav"), ("--report", args.report, "json"))
    outputs = [(flag, path, kind) for flag, path, kind in named if path is not None]
    if args.out is not None and args.report is not None and args.out.resolve() == args.report.resolve():
        return f"--out and --report both name {args.out}"
    for flag, path, kind in outputs:
        if path.is_dir():
            return f"{flag} {path} is a directory; name a file"
        if any(_same_file(path, source) or path.resolve() == source.resolve() for source in inputs):
            return f"{flag} {path} is an input of this run; it would be overwritten"
        problem = directory_problem(path.parent)
        if problem:
            return f"{flag} {path} cannot be written: {problem}"
        if path.exists() and not args.force and not _looks_like(path, kind):
            what = "a WAV file" if kind == "wav" else "a JSON report"
            return f"{flag} {path} exists and is not {what}; pass --force to replace it"
    return None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run like Ctrl-C: the audio so far is kept


def main(argv: list[str] | None = None, prog: str = "vllm-omni-edge client") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.out is None and not args.pcm_stdout:
        print("error: nothing to write: give --out FILE.wav and/or --pcm-stdout", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print(f"error: --timeout must be > 0 seconds, found {args.timeout}", file=sys.stderr)
        return 2
    problem = _check_sources(args) or check_outputs(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("error: interrupted before decoding started", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _run(args: argparse.Namespace) -> int:
    try:
        if args.server:
            use_api_key(args.server, args.api_key)
            plan = fetch_plan(plan_url(args.server, args.hardware), args.cache_dir, timeout=args.timeout)
        else:
            plan = fetch_plan(args.plan, args.cache_dir, timeout=args.timeout)
        client = EdgeClient(plan, rknn_runtime=args.rknn_runtime, jitter_ms=args.jitter_ms)
        if args.server and args.text_stdin:
            stream = open_text_stream(args.server, _speech_body(args), sys.stdin.buffer, args.api_key, args.timeout)
        elif args.server:
            stream = open_speech_stream(args.server, _speech_body(args), timeout=args.timeout)
        else:
            stream = open_stream(args.stream, timeout=args.timeout)
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sinks, wav = [], None
    try:
        if args.out is not None:
            wav = WavWriter(args.out, plan.codec.sample_rate)
            sinks.append(wav.write)
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc}", file=sys.stderr)
        return 1
    if args.pcm_stdout:
        sinks.append(_write_pcm_stdout)
    report = None
    try:
        report = client.run(stream, sinks)  # stream and decoder errors, and Ctrl-C, end up in report.error
    finally:
        stream.close()  # stdin: its descriptor stays open (the reader thread may still be blocked on it)
        if wav is not None:
            if wav.samples == 0 and (report is None or report.error is not None):
                wav.discard()  # a failed run that decoded nothing leaves an existing file at --out as it was
            else:
                kept = wav.close()
                if report is not None:
                    report.wav = str(kept)
    print(f"[client] plan {plan.plan_id[:12]} ({plan.hardware_class}): {report.summary()}", file=sys.stderr)
    if args.report:
        try:
            args.report.write_text(json.dumps(asdict(report), indent=2))
        except OSError as exc:
            print(f"error: cannot write the report {args.report}: {exc}", file=sys.stderr)
            return 1
    if report.error:
        kept = f"; the audio decoded so far ({report.audio_seconds:.2f} s) is in {report.wav}" if report.wav else ""
        print(f"error: {report.error}{kept}", file=sys.stderr)
        return 1
    return 0


def _check_sources(args: argparse.Namespace) -> str | None:
    """Either --stream and --plan, or --server with --hardware and --text: the usage error, if any."""
    if args.server:
        if args.stream or args.plan:
            return "--server takes plan and stream from the server: drop --stream/--plan"
        if not args.hardware or bool(args.text) == bool(args.text_stdin):
            return "--server needs --hardware CLASS and one of --text or --text-stdin"
        return None
    if args.text_stdin:
        return "--text-stdin speaks through a server: give --server URL --hardware CLASS"
    if not args.stream or not args.plan:
        return "give --stream and --plan (a recording or URL and its plan), or --server URL --hardware CLASS --text"
    return None


def _speech_body(args: argparse.Namespace) -> dict:
    body = {
        "input": args.text,
        "voice": args.voice,
        "language": args.language,
        "instructions": args.instructions,
        "edge_hardware": args.hardware,
        "max_frames": args.max_frames,
        "greedy": True if args.greedy else None,
        "seed": args.seed,
    }
    return {key: value for key, value in body.items() if value is not None}


def _write_pcm_stdout(pcm: np.ndarray) -> None:
    sys.stdout.buffer.write(float_to_pcm16(pcm).tobytes())
    sys.stdout.buffer.flush()
