"""What a benchmark leaves behind: its JSON (the numbers docs cite), a Markdown table, a plot.

Numbers are reported as measured and as ratios against a baseline measured in the same run; the JSON is the
record, the table a reading of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from vllm_omni.edge.files import write_atomically

from .errors import BenchmarkError
from .processes import REPO_ROOT


def write_json(path: str | Path, report: Any, indent: int = 2) -> Path:
    """``report`` as JSON at ``path`` (folders made; written whole or not at all)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, lambda target: target.write_text(json.dumps(report, indent=indent)))


def number(value: float | None, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals; ``-`` for None (not measured)."""
    return "-" if value is None else f"{value:.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table. A cell is written as ``str(cell)``, None as ``-``; format numbers before (:func:`number`).

    ``align`` has one letter per column, ``l`` or ``r``; by default the first column is left-aligned (the row's
    name) and the others right-aligned (measurements).
    """
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(headers)} columns")
    rules = ["---:" if side == "r" else "---" for side in align]
    lines = [_row(headers), _row(rules)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a row of {len(row)} cells under {len(headers)} headers: {row}")
        lines.append(_row(["-" if cell is None else str(cell) for cell in row]))
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def plot(
    path: str | Path, draw: Callable[[Any], Any], *, dpi: int = 110, elsewhere: Sequence[str] | None = None
) -> Path | None:
    """``draw(pyplot)`` returns a figure, saved as ``path`` (PNG): the path, or None without matplotlib.

    The serving venv has no matplotlib: with ``elsewhere`` (the arguments of ``python -m ...`` that draw this
    plot from the JSON), the main venv (``.venv``) is asked to draw it instead.
    """
    path = Path(path)
    try:
        import matplotlib
    except ImportError:
        return _plot_elsewhere(path, elsewhere)
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure = draw(pyplot)
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    pyplot.close(figure)
    return path


def _plot_elsewhere(path: Path, elsewhere: Sequence[str] | None) -> Path | None:
    main_python = REPO_ROOT / ".venv" / "bin" / "python"
    if elsewhere and main_python.exists() and main_python.absolute() != Path(sys.executable).absolute():
        completed = subprocess.run([str(main_python), "-m", *elsewhere], capture_output=True, text=True)
        if completed.returncode != 0:
            raise BenchmarkError(f"drawing {path} under {main_python} failed:\n{completed.stderr[-2000:]}")
        return path if path.exists() else None
    print(f"[bench] matplotlib is not installed here: no {path.name} (pip install matplotlib, or use .venv)")
    return None
