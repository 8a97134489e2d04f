"""Writing artifacts so that a reader never sees half a file, and digesting them (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_matches(path: str | os.PathLike[str], size_bytes: Any, sha256: Any) -> bool:
    """Whether ``path`` is a file of exactly ``size_bytes`` bytes hashing to ``sha256`` (size first: it is cheap)."""
    path = Path(path)
    return path.is_file() and path.stat().st_size == size_bytes and file_sha256(path) == sha256


def write_atomically(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Call ``write(temporary)`` and rename the temporary file to ``path`` only if it returns.

    The temporary sits beside ``path`` as ``.<stem>.<random>.partial<suffix>`` (hidden, and keeping
    the suffix that toolchains such as ``torch.export.save`` or rknn-toolkit2 insist on). It is
    removed when ``write`` raises, so a failed write leaves nothing that looks finished.
    """
    path = Path(path)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def write_json_atomically(path: str | os.PathLike[str], payload: Any) -> Path:
    return write_atomically(path, lambda temporary: temporary.write_text(json.dumps(payload, indent=2) + "\n"))
