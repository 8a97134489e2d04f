"""Files verified once and remembered by identity, so a device does not re-hash hundreds of MB per start.

A plan's artifacts are checked against their sha256 before any runtime sees them. Hashing a
457 MB step graph costs about half a second, on every start. After a file hashes to what its
record says, this store remembers the file's identity: absolute path, device, inode, size,
mtime and ctime in nanoseconds. The next check of the same identity returns the remembered digest
without reading the file. Any write to the file changes its ctime, and a replaced file has another
inode, so a changed file is hashed again and refused. Setting ctime back needs the system clock,
not just write access to the file.

The store is a small JSON file in the user's cache directory (:func:`cache_dir`, overridable with
``VLLM_OMNI_EDGE_CACHE_DIR``). ``VLLM_OMNI_EDGE_REMEMBER_VERIFIED=0`` turns it off, so every check hashes.
A store that is missing, unreadable or damaged counts as empty. It holds at most
:data:`MAX_ENTRIES` files, the oldest dropped first. No torch here.
"""

from __future__ import annotations

import os
from pathlib import Path

from .files import file_sha256, parse_json, read_bounded, write_json_atomically

STORE_NAME = "verified-files.json"
STORE_VERSION = 1
MAX_ENTRIES = 4096
CACHE_ENV = "VLLM_OMNI_EDGE_CACHE_DIR"
REMEMBER_ENV = "VLLM_OMNI_EDGE_REMEMBER_VERIFIED"


class _StoreError(Exception):
    pass


def cache_dir() -> Path:
    """Where this subsystem keeps per-device state: ``$VLLM_OMNI_EDGE_CACHE_DIR``, else the XDG cache."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vllm-omni-edge"


def enabled() -> bool:
    return os.environ.get(REMEMBER_ENV, "1") != "0"


def identity(path: str | os.PathLike[str]) -> list[int] | None:
    """What changes whenever the file's bytes can have changed, or ``None`` when it is not a regular file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _load() -> dict[str, list]:
    path = cache_dir() / STORE_NAME
    try:
        payload = parse_json(read_bounded(path), str(path), _StoreError, "")
    except (OSError, _StoreError):
        return {}
    files = payload.get("files") if isinstance(payload, dict) and payload.get("version") == STORE_VERSION else None
    return files if isinstance(files, dict) else {}


def _key(path: str | os.PathLike[str], kind: str) -> str:
    return f"{kind}:{Path(path).resolve()}"


def remembered_sha256(path: str | os.PathLike[str], kind: str = "sha256") -> str | None:
    """The digest recorded for ``path`` if its identity is unchanged since it was verified, else ``None``.

    ``kind`` keeps different facts apart: ``sha256`` (the file hashes to the digest), ``plan`` (the
    plan file passed full validation, schema included).
    """
    if not enabled():
        return None
    now = identity(path)
    row = _load().get(_key(path, kind))
    if now is None or not isinstance(row, list) or len(row) != 6 or row[:5] != now or not isinstance(row[5], str):
        return None
    return row[5]


def remember(path: str | os.PathLike[str], digest: str, kind: str = "sha256") -> None:
    """Record that ``path``, as it is now, hashes to ``digest`` (call only right after checking it)."""
    if not enabled():
        return
    now = identity(path)
    if now is None:
        return
    files = _load()
    key = _key(path, kind)
    files.pop(key, None)  # re-inserted last: the newest entry is dropped last
    files[key] = [*now, digest]
    while len(files) > MAX_ENTRIES:
        files.pop(next(iter(files)))
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_json_atomically(cache_dir() / STORE_NAME, {"version": STORE_VERSION, "files": files})
    except OSError:
        pass  # a read-only cache only costs the next start a hash


def verified_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of ``path``: remembered if its identity is unchanged since it was hashed, else hashed now and remembered.

    Pass it as ``sha256_of`` to :func:`~.files.check_file` where a file is checked on every start.
    """
    digest = remembered_sha256(path)
    if digest is None:
        before = identity(path)
        digest = file_sha256(path)
        if identity(path) == before:  # not written to while it was read
            remember(path, digest)
    return digest
