"""The README's layout table matches the tree: every package under ``vllm_omni/`` is named in its first column,
and every path that column names exists.

A row's first column holds code spans: a path from the repository root (``vllm_omni/edge/plan/``), then paths
beside it written short (``hardware/`` there is ``vllm_omni/edge/hardware/``). A package counts as named when the
column names it or something inside it (``vllm_omni/model_executor/`` is named by the rows of its models).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ROOTS = ("vllm_omni/", "tools/", "benchmarks/", "docs/", "web/", "tests/", "examples/", "requirements/")


def layout_rows(text: str) -> list[str]:
    """The first cell of each body row of the table under ``## Layout``."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) > 2, "no layout table under '## Layout' in README.md"
    return [row.split(" | ", 1)[0].removeprefix("| ") for row in rows[2:]]  # past the header and its rule


def named_paths(cell: str) -> list[str]:
    """The paths a first cell names, each from the repository root (short ones beside the cell's first path)."""
    spans = re.findall(r"`([^`]+)`", cell)
    assert spans and spans[0].startswith(ROOTS), f"a layout row starts with a path from the repository root: {cell}"
    beside = spans[0].rstrip("/").rsplit("/", 1)[0]
    return [span if span.startswith(ROOTS) else f"{beside}/{span}" for span in spans]


def packages() -> list[str]:
    return sorted(f"{path.parent.relative_to(REPO).as_posix()}/" for path in (REPO / "vllm_omni").rglob("__init__.py"))


def test_the_table_is_read_as_its_rows_say():
    cells = layout_rows(README.read_text())
    assert named_paths("`vllm_omni/edge/plan/`, `hardware/`, `stream/`") == [
        "vllm_omni/edge/plan/",
        "vllm_omni/edge/hardware/",
        "vllm_omni/edge/stream/",
    ]
    assert named_paths("`vllm_omni/edge/geometry.py`, `audio.py`") == [
        "vllm_omni/edge/geometry.py",
        "vllm_omni/edge/audio.py",
    ]
    assert any("vllm_omni/entrypoints/cli/" in named_paths(cell) for cell in cells)


def test_every_package_under_vllm_omni_is_named_in_the_readme_layout_table():
    named = [path for cell in layout_rows(README.read_text()) for path in named_paths(cell)]
    missing = [package for package in packages() if not any(path.startswith(package) for path in named)]
    assert not missing, (
        f"README.md's layout table names no path in {missing}: add a row (first column the package's path) that "
        "says what it holds"
    )


def test_every_path_the_layout_table_names_exists():
    named = [path for cell in layout_rows(README.read_text()) for path in named_paths(cell)]
    stale = [path for path in named if not (REPO / path).exists()]
    assert not stale, f"README.md's layout table names {stale}, which the tree does not hold: fix or drop the row"


def top_level_folders() -> list[str]:
    """The repository's top-level folders that hold tracked files (hidden ones, such as ``.ci/``, aside)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted({f"{line.split('/', 1)[0]}/" for line in listed.splitlines() if "/" in line and line[0] != "."})


def test_every_top_level_folder_is_named_in_the_readme_layout_table():
    named = [path for cell in layout_rows(README.read_text()) for path in named_paths(cell)]
    folders = top_level_folders()
    assert "vllm_omni/" in folders and "web/" in folders
    missing = [folder for folder in folders if not any(path.startswith(folder) for path in named)]
    assert not missing, f"README.md's layout table has no row for {missing}: add one that says what it holds"


# Test folders of what is not a package: the benchmarks' harness, the examples, the page's node fixtures, tools/.
BESIDE_THE_PACKAGE = ("benchmarks", "examples", "web", "tools")


def test_the_tests_mirror_the_package():
    """A folder of tests is the package folder it tests (``tests/edge/plan/`` tests ``vllm_omni/edge/plan/``)."""
    tests = REPO / "tests"
    folders = sorted({path.parent.relative_to(tests) for path in tests.rglob("test_*.py")} - {Path(".")})
    assert len(folders) > 10
    astray = [
        folder.as_posix()
        for folder in folders
        if folder.parts[0] not in BESIDE_THE_PACKAGE and not (REPO / "vllm_omni" / folder).is_dir()
    ]
    assert not astray, f"tests/{astray} mirror no folder of vllm_omni/: move them where their package is"
