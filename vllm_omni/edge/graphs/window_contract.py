"""The windowed program's contract, stated once: which window decodes which chunk, and its I/O (no torch).

A windowed program decodes ``int64[1, Q, context_frames + chunk_frames]`` and returns the audio of
the trailing ``chunk_frames``. A stream's chunk sizes follow the *ramp* (small chunks first for
low latency, then the last ramp size forever). Windows never hold made-up frames: while fewer
than ``context`` frames have been decoded, a window's context is *all* of them, so those windows
decode exactly like the full decode (the decoder is causal). From then on every window is
``context + chunk``, an approximation because the decoder's receptive field is longer.

Example, ramp 2 4 8 16 25 and context 72, in stream order (context + chunk)::

    0+2, 2+4, 6+8, 14+16, 30+25, 55+25, 72+25 (repeats)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ..errors import EdgeError
from ..geometry import CodecGeometry

WINDOW_SCHEMA_VERSION = 1
INPUT_NAME = "audio_codes"
OUTPUT_NAME = "audio_values"


# Bounds checked before any schedule is computed (a plan or a command line may be hostile): far above
# any useful ramp (the default schedule has 7 windows, the released context is 72 frames), far below a
# schedule that would take noticeable time or memory. Every window of a schedule is one exported program.
MAX_CONTEXT_FRAMES = 4096
MAX_CHUNK_FRAMES = 4096
MAX_WINDOWS = 256


class WindowConfigError(EdgeError, ValueError):
    """A ramp or context that cannot make a window schedule."""


@dataclass(frozen=True, order=True)
class Window:
    """One fixed-shape program: ``context_frames`` of already-decoded history + ``chunk_frames`` new."""

    context_frames: int
    chunk_frames: int

    @property
    def window_frames(self) -> int:
        return self.context_frames + self.chunk_frames

    @property
    def name(self) -> str:
        """File stem of the window's program, e.g. ``window_c72_n25``."""
        return f"window_c{self.context_frames}_n{self.chunk_frames}"


def check_ramp(ramp: Sequence[int], context: int) -> tuple[int, ...]:
    """Return ``ramp`` as a tuple, or raise :class:`WindowConfigError` saying what is wrong."""
    if isinstance(ramp, str | bytes) or not isinstance(ramp, Sequence):
        raise WindowConfigError(f"the ramp is a list of chunk sizes in frames, found {type(ramp).__name__}")
    if len(ramp) > MAX_WINDOWS:
        raise WindowConfigError(f"the ramp has {len(ramp)} chunk sizes; at most {MAX_WINDOWS} (one program each)")
    ramp = tuple(ramp)
    if not ramp:
        raise WindowConfigError("the ramp is empty; give chunk sizes in frames, e.g. --ramp 2 4 8 16 25")
    if any(type(size) is not int or not 1 <= size <= MAX_CHUNK_FRAMES for size in ramp):
        raise WindowConfigError(
            f"ramp chunk sizes must be integers >= 1 (at most {MAX_CHUNK_FRAMES}), found {_shorten(ramp)}"
        )
    if any(later <= earlier for earlier, later in pairwise(ramp)):
        raise WindowConfigError(
            f"the ramp must be strictly increasing (small chunks first, the last size repeats), found {_shorten(ramp)}"
        )
    if type(context) is not int or not 0 <= context <= MAX_CONTEXT_FRAMES:
        raise WindowConfigError(
            f"context must be an integer >= 0 frames (at most {MAX_CONTEXT_FRAMES}), found {context!r}"
        )
    count = schedule_length(ramp, context)
    if count > MAX_WINDOWS:
        raise WindowConfigError(
            f"the ramp {_shorten(ramp)} with context {context} needs {count} windows (one program each); at most "
            f"{MAX_WINDOWS}: use a larger last chunk or a shorter context"
        )
    return ramp


def schedule_length(ramp: tuple[int, ...], context: int) -> int:
    """How many windows :func:`window_schedule` makes, computed without making them."""
    before_last = sum(ramp[:-1])
    if before_last >= context:
        return len(ramp)
    # After the ramp, windows of the last size repeat until one holds the whole context.
    decoded = before_last + ramp[-1]
    return len(ramp) + 1 + max(0, -(-(context - decoded) // ramp[-1]))


def _shorten(ramp: Sequence[Any]) -> str:
    shown = list(ramp[:12])
    return f"{shown}" if len(ramp) <= 12 else f"{shown[:-1]} ... ({len(ramp)} sizes)"


def window_schedule(ramp: Sequence[int], context: int) -> tuple[Window, ...]:
    """The windows of a stream in order; the last one repeats for the rest of the stream.

    Each entry is distinct, so the schedule is also the list of programs to export.
    """
    ramp = check_ramp(ramp, context)
    windows: list[Window] = []
    decoded = 0
    for chunk in ramp:
        windows.append(Window(min(decoded, context), chunk))
        decoded += chunk
    steady = ramp[-1]
    while windows[-1].context_frames < context:  # at most MAX_WINDOWS: check_ramp counted them
        windows.append(Window(min(decoded, context), steady))
        decoded += steady
    return tuple(windows)


def window_at(schedule: Sequence[Window], chunk_index: int) -> Window:
    """The window that decodes the ``chunk_index``-th chunk (0-based) of a stream."""
    return schedule[min(chunk_index, len(schedule) - 1)]


def windowing_overhead(window: Window) -> float:
    """Compute per chunk relative to decoding only the chunk: ``(context + chunk) / chunk``."""
    return window.window_frames / window.chunk_frames


@dataclass(frozen=True)
class WindowContract:
    """What one windowed program takes and returns, and what it says about itself.

    ``int64[1, Q, context + chunk]`` (``audio_codes``) -> ``float32[1, chunk * samples_per_frame]``
    (``audio_values``). The same contract is baked into the program (:meth:`metadata`), written
    into the plan (:meth:`to_json`) and the manifest (:meth:`input_shape`, :meth:`output_shape`),
    and checked by the runtime (:meth:`check_metadata`).
    """

    window: Window
    geometry: CodecGeometry

    def input_shape(self) -> tuple[int, ...]:
        return (1, self.geometry.num_quantizers, self.window.window_frames)

    def output_shape(self) -> tuple[int, ...]:
        return (1, self.window.chunk_frames * self.geometry.samples_per_frame)

    def metadata(self) -> dict[str, int]:
        """What a program says about itself (ExecuTorch constant methods, the ``.pt2`` extra file)."""
        return {
            "schema_version": WINDOW_SCHEMA_VERSION,
            "sample_rate": self.geometry.sample_rate,
            "samples_per_frame": self.geometry.samples_per_frame,
            "num_quantizers": self.geometry.num_quantizers,
            "codebook_size": self.geometry.codebook_size,
            "context_frames": self.window.context_frames,
            "chunk_frames": self.window.chunk_frames,
            "window_frames": self.window.window_frames,
        }

    def to_json(self) -> dict[str, Any]:
        """The contract as an execution plan records it for the window's artifact."""
        return {
            "context_frames": self.window.context_frames,
            "chunk_frames": self.window.chunk_frames,
            "inputs": {INPUT_NAME: list(self.input_shape())},
            "outputs": {OUTPUT_NAME: list(self.output_shape())},
        }

    def metadata_mismatches(self, metadata: Mapping[str, int]) -> dict[str, tuple[int, Any]]:
        """``{key: (expected, found)}`` for each of the window's shape fields the program states differently."""
        keys = ("context_frames", "chunk_frames", "samples_per_frame", "num_quantizers", "sample_rate")
        expected = self.metadata()
        return {key: (expected[key], metadata.get(key)) for key in keys if metadata.get(key) != expected[key]}
