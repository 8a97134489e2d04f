"""Output paths checked before any work: ``directory_problem`` says why one cannot be written."""

import os
from pathlib import Path

from vllm_omni.edge.files import directory_problem


def test_a_directory_that_exists_or_can_be_created_has_no_problem(tmp_path):
    assert directory_problem(tmp_path) is None
    assert directory_problem(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()  # nothing is created


def test_a_file_or_a_path_under_a_file_is_named(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert directory_problem(notes) == f"{notes} is a file, not a directory"
    for below in (notes / "sub", notes / "sub" / "deeper"):
        assert directory_problem(below) == f"{notes} is a file, not a directory, so nothing can be created under it"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "missing")
    assert directory_problem(dangling / "sub") == f"{dangling} is not a directory, so nothing can be created under it"


def test_a_directory_this_process_may_not_write_is_named(tmp_path, monkeypatch):
    """``os.access`` says no for ``locked`` (a chmod would not: the tests may run as root)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    assert directory_problem(locked) == f"the directory {locked} is not writable"
    assert (
        directory_problem(locked / "a") == f"the directory {locked} is not writable, so nothing can be created under it"
    )
    assert directory_problem(tmp_path / "elsewhere") is None
