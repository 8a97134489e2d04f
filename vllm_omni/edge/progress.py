"""Progress lines of long work (export, conversion, serving start-up): one tagged line each, on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def progress_printer(tag: str) -> Progress:
    """A ``progress(message)`` callable printing ``[tag] message`` to stderr at once (not buffered)."""

    def say(message: str) -> None:
        print(f"[{tag}] {message}", file=sys.stderr, flush=True)

    return say
