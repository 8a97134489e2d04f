"""Files verified once are remembered by identity; any change to a file makes the next check hash it again."""

from __future__ import annotations

import os

import pytest

from vllm_omni.edge import integrity
from vllm_omni.edge.files import file_sha256


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(integrity.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / integrity.STORE_NAME


def test_a_verified_file_is_not_read_again_until_it_changes(tmp_path, store, monkeypatch):
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"weights" * 1000)
    digest = file_sha256(path)
    assert integrity.remembered_sha256(path) is None
    assert integrity.verified_sha256(path) == digest and store.is_file()
    assert integrity.remembered_sha256(path) == digest

    reads = []
    monkeypatch.setattr(integrity, "file_sha256", lambda p: reads.append(p) or "never")
    assert integrity.verified_sha256(path) == digest and reads == []  # remembered: not read

    stat = path.stat()
    with open(path, "r+b") as handle:  # same size, one byte changed, mtime set back: ctime still moves
        handle.write(b"W")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert integrity.remembered_sha256(path) is None
    assert integrity.verified_sha256(path) == "never" and reads == [path]


def test_a_replaced_file_is_hashed_again(tmp_path, store):
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"a" * 64)
    integrity.verified_sha256(path)
    replacement = tmp_path / "other"
    replacement.write_bytes(b"b" * 64)
    os.replace(replacement, path)
    assert integrity.remembered_sha256(path) is None
    assert integrity.verified_sha256(path) == file_sha256(path)


@pytest.mark.parametrize("content", [b"", b"[]", b'{"version": 1, "files": []}', b"\xff\xfe", b"[" * 100_000])
def test_a_damaged_store_counts_as_empty(tmp_path, store, content):
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"x")
    store.parent.mkdir(parents=True)
    store.write_bytes(content)
    assert integrity.remembered_sha256(path) is None
    assert integrity.verified_sha256(path) == file_sha256(path)
    assert integrity.remembered_sha256(path) == file_sha256(path)


def test_remembering_can_be_turned_off(tmp_path, store, monkeypatch):
    monkeypatch.setenv(integrity.REMEMBER_ENV, "0")
    path = tmp_path / "graph.onnx"
    path.write_bytes(b"x")
    integrity.verified_sha256(path)
    assert not store.exists() and integrity.remembered_sha256(path) is None


def test_the_store_keeps_a_bounded_number_of_files(tmp_path, store, monkeypatch):
    monkeypatch.setattr(integrity, "MAX_ENTRIES", 3)
    paths = []
    for index in range(5):
        path = tmp_path / f"f{index}"
        path.write_bytes(bytes([index]))
        integrity.verified_sha256(path)
        paths.append(path)
    assert [integrity.remembered_sha256(p) is not None for p in paths] == [False, False, True, True, True]
