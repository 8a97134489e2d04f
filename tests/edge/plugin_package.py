"""Packages installed for one test as an editable install is: modules (and a distribution declaring an entry point)
found through a finder on ``sys.meta_path``, the hook setuptools' editable installs use, not a ``sys.path`` entry."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import DistributionFinder, PathDistribution
from pathlib import Path

import pytest


class InstalledForTest(DistributionFinder):
    """Finds the modules of ``files`` (dotted name -> source file; a package's is its ``__init__.py``) and the
    distribution of ``dist_info`` (a ``.dist-info`` directory), nothing else."""

    def __init__(self, files: dict[str, Path], dist_info: Path | None = None) -> None:
        self.files = files
        self.distribution = PathDistribution(dist_info) if dist_info is not None else None

    def find_spec(self, fullname, path=None, target=None):
        source = self.files.get(fullname)
        if source is None:
            return None
        package = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(fullname, source, submodule_search_locations=package)

    def find_distributions(self, context=None):
        name = None if context is None else context.name
        if self.distribution is not None and name in (None, self.distribution.name):
            yield self.distribution


def install_modules(monkeypatch: pytest.MonkeyPatch, files: dict[str, Path], dist_info: Path | None = None) -> None:
    """Make ``files`` (and ``dist_info``) importable for this test, ahead of anything installed."""
    for name in files:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [InstalledForTest(files, dist_info), *sys.meta_path])


def install_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, group: str, entry: str
) -> None:
    """Write ``module``.py holding ``source`` and a ``module``-1.0 distribution whose entry point ``entry``
    (``"name = module:attribute"``) is in ``group``, installed for this test (:func:`install_modules`)."""
    (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    install_modules(monkeypatch, {module: tmp_path / f"{module}.py"}, dist)
