"""A package installed only on ``sys.path`` for a test: one module and a distribution declaring one entry point."""

from __future__ import annotations

from pathlib import Path

import pytest


def install_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, group: str, entry: str
) -> None:
    """Write ``module``.py holding ``source`` and a ``module``-1.0 distribution whose entry point ``entry``
    (``"name = module:attribute"``) is in ``group``; put ``tmp_path`` first on ``sys.path`` for this test."""
    (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
