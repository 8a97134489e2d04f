"""A benchmark that cannot go on raises :class:`BenchmarkError`; :func:`run_cli` turns it into one line and exit 1."""

from __future__ import annotations

import sys
from collections.abc import Callable


class BenchmarkError(RuntimeError):
    """What a benchmark needed and did not get (a worker that failed, a server that did not start, a missing venv)."""


def run_cli(main: Callable[[], int]) -> int:
    """``main()``'s exit code; a :class:`BenchmarkError` is printed as ``error: ...`` and exits 1."""
    try:
        return main()
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
