"""What one client may ask of the speech routes: sizes, WebSocket times and queued text, decode threads.

Every limit is checked before the text reaches the tokenizer or the engine, and each has a ``vllm serve``
flag (:func:`add_limit_arguments`); ``docs/serving/serve.md`` lists them.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, fields, replace

ZERO_MEANS_AUTO = ("decode_workers", "max_sockets", "max_responses", "max_queued_jobs")
# Bounds in use before the engine's capacity is known (auto): the guard's before the process loads its state, and
# a speech service made without one.
UNKNOWN_ENGINE_RESPONSES = 64
UNKNOWN_ENGINE_QUEUED_JOBS = 16


@dataclass(frozen=True)
class SpeechLimits:
    """The limits of one server. Text lengths are in characters (OpenAI caps ``input`` at 4096)."""

    max_body_bytes: int = 1 << 20  # a POST body, and one WebSocket message
    max_input_chars: int = 4096  # ``input`` of one request; one WebSocket text piece
    max_instructions_chars: int = 4096
    socket_idle_s: float = 60.0  # a WebSocket with nothing to say and no message from its client
    socket_max_s: float = 1800.0  # a WebSocket session, whatever it does
    socket_max_queued_chars: int = 16384  # text a WebSocket client sent that is not spoken yet
    socket_max_queued_utterances: int = 128  # utterances (first vocabulary: sentences) a session holds unspoken
    decode_workers: int = 0  # server-side decode/encode threads; 0: one per CPU, at most 4
    max_voices: int = 256  # uploaded voices kept (Base checkpoints)
    max_voice_bytes: int = 64 << 20  # their files together
    max_sockets: int = (
        0  # open speech WebSocket sessions of the server (split between API processes); 0: half of max_num_seqs
    )
    max_batch_items: int = 32  # items of one POST /v1/audio/speech/batch (upstream's default)
    # HTTP speech responses in flight per API server process, a batch as its items (then 503); 0: the engine's
    # capacity, its max_num_seqs slots and as many waiting, shared by the API processes (for_engine)
    max_responses: int = 0
    max_voice_uploads: int = 4  # voice uploads in flight per API server process (then 503)
    # prompt builds, and voice encodings, waiting or running (each pool; then 503); 0: room for every response and
    # session admitted (for_engine), so the first bound a request meets is the engine's
    max_queued_jobs: int = 0
    stream_hold_s: float = 2.0  # a paused stream-mode utterance keeps its KV this long (as streamed_text.HOLD_S)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or value < 0 or (value == 0 and f.name not in ZERO_MEANS_AUTO):
                raise ValueError(f"{f.name} must be positive, got {value}")

    @property
    def decode_threads(self) -> int:
        return self.decode_workers or max(1, min(4, os.cpu_count() or 1))

    def for_engine(self, max_num_seqs: int, processes: int, sockets: int) -> SpeechLimits:
        """These limits with the automatic ones (0) sized from the engine: ``max_responses`` its ``max_num_seqs``
        slots and an equal waiting room, split between ``processes`` API processes; ``max_queued_jobs`` room for
        the prompt of every response admitted and of each of the process's ``sockets`` sessions."""
        responses = self.max_responses or max(1, 2 * max_num_seqs // max(1, processes))
        return replace(self, max_responses=responses, max_queued_jobs=self.max_queued_jobs or responses + sockets)

    @property
    def responses_bound(self) -> int:
        """``max_responses``, or before the engine is known (auto) :data:`UNKNOWN_ENGINE_RESPONSES`."""
        return self.max_responses or UNKNOWN_ENGINE_RESPONSES

    @property
    def queued_jobs_bound(self) -> int:
        """``max_queued_jobs``, or before the engine is known (auto) :data:`UNKNOWN_ENGINE_QUEUED_JOBS`."""
        return self.max_queued_jobs or UNKNOWN_ENGINE_QUEUED_JOBS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SpeechLimits:
        """The limits ``vllm serve`` was started with (defaults where a flag is absent)."""
        given = {f.name: getattr(args, f"speech_{f.name}", None) for f in fields(cls)}
        return cls(**{name: value for name, value in given.items() if value is not None})


# flag (after --speech-) -> (field, type, help)
_FLAGS = {
    "max-body-bytes": ("max_body_bytes", int, "largest POST /v1/audio/speech body and WebSocket message"),
    "max-input-chars": ("max_input_chars", int, "longest `input` of a request, and WebSocket text piece"),
    "max-instructions-chars": ("max_instructions_chars", int, "longest `instructions`"),
    "socket-idle-s": ("socket_idle_s", float, "close a speech WebSocket idle this long (nothing to speak, no message)"),
    "socket-max-s": ("socket_max_s", float, "close a speech WebSocket session after this long"),
    "socket-max-queued-chars": ("socket_max_queued_chars", int, "most text a WebSocket client may queue unspoken"),
    "socket-max-queued-utterances": (
        "socket_max_queued_utterances",
        int,
        "most utterances a WebSocket session may queue unspoken (upstream's vocabulary: each input.done; the first: "
        "each sentence)",
    ),
    "decode-workers": ("decode_workers", int, "threads decoding server-side PCM and encoding audio (0: auto)"),
    "max-voices": ("max_voices", int, "uploaded voices kept on disk (Base checkpoints)"),
    "max-voice-bytes": ("max_voice_bytes", int, "bytes of all uploaded voices' files together"),
    "max-sockets": (
        "max_sockets",
        int,
        "open speech WebSocket sessions of the server, split evenly between its API processes (0: half the engine's "
        "max_num_seqs, leaving the rest for HTTP requests)",
    ),
    "max-batch-items": ("max_batch_items", int, "items of one POST /v1/audio/speech/batch"),
    "max-responses": (
        "max_responses",
        int,
        "HTTP speech responses in flight per API server process, a batch counted as the items it runs at once "
        "(more are refused with 503 and Retry-After; 0: the engine's max_num_seqs and as many waiting, split "
        "between the API processes)",
    ),
    "max-voice-uploads": (
        "max_voice_uploads",
        int,
        "POST /v1/audio/voices requests in flight per API server process (more are refused with 503 and Retry-After)",
    ),
    "max-queued-jobs": (
        "max_queued_jobs",
        int,
        "prompt builds, and reference-audio encodings, waiting or running at once (each; more are refused with "
        "503 and Retry-After; 0: room for every response and session the process admits)",
    ),
    "stream-hold-s": (
        "stream_hold_s",
        float,
        "seconds a stream-mode utterance waiting for text keeps its KV cache (within half the engine's slots and "
        "blocks) before it is released, to resume exactly when its text comes",
    ),
}


def add_limit_arguments(group: argparse._ArgumentGroup) -> None:
    """The ``--speech-*`` flags of ``vllm serve --omni`` (defaults: :class:`SpeechLimits`)."""
    group.add_argument(
        "--speech-allowed-origins",
        dest="speech_allowed_origins",
        default=None,
        metavar="ORIGIN[,ORIGIN]",
        help="web pages of these origins (scheme://host[:port]) may open the speech WebSocket and send "
        "state-changing requests besides the server's own; another Origin is refused with 403 (clients that send "
        "none, not browsers, pass)",
    )
    group.add_argument(
        "--speech-allowed-hosts",
        dest="speech_allowed_hosts",
        default=None,
        metavar="NAME[,NAME]",
        help="host names this server answers to besides IP addresses, localhost, --host and the allowed origins' "
        "hosts (a request with another Host is refused with 403: DNS rebinding); '*' answers to any name",
    )
    group.add_argument(
        "--speech-open-metrics",
        dest="speech_open_metrics",
        action="store_true",
        help="serve GET /metrics without the API key (for a scraper on a private port); by default a server "
        "started with --api-key asks for it there too",
    )
    defaults = SpeechLimits()
    for flag, (name, kind, text) in _FLAGS.items():
        group.add_argument(
            f"--speech-{flag}",
            dest=f"speech_{name}",
            type=kind,
            default=None,
            metavar="N",
            help=f"{text} (default {getattr(defaults, name)})",
        )
