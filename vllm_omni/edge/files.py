"""Writing artifacts so that a reader never sees half a file, and digesting them (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.json_limits import MAX_JSON_DEPTH, json_depth


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileMismatch:
    """How a file differs from its record: ``field`` is ``file`` (missing), ``size_bytes`` or ``sha256``."""

    field: str
    found: int | str | None = None


def check_file(
    path: str | os.PathLike[str],
    size_bytes: Any,
    sha256: Any,
    check_sha256: bool = True,
    sha256_of: Callable[[Path], str] = file_sha256,
) -> FileMismatch | None:
    """``None`` when ``path`` is a file of ``size_bytes`` bytes hashing to ``sha256``, else the first difference.

    The one size + sha256 verification of the subsystem (plans, manifests, kept artifacts, downloads):
    size first, because it is cheap; the hash only when ``check_sha256``, computed by ``sha256_of``
    (:func:`vllm_omni.edge.integrity.verified_sha256` remembers files it has hashed).
    """
    path = Path(path)
    if not path.is_file():
        return FileMismatch("file")
    size = path.stat().st_size
    if size != size_bytes:
        return FileMismatch("size_bytes", size)
    if check_sha256:
        digest = sha256_of(path)
        if digest != sha256:
            return FileMismatch("sha256", digest)
    return None


def file_matches(path: str | os.PathLike[str], size_bytes: Any, sha256: Any) -> bool:
    """Whether ``path`` is a file of exactly ``size_bytes`` bytes hashing to ``sha256``."""
    return check_file(path, size_bytes, sha256) is None


def directory_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why files cannot be written into ``directory`` (creating it first if need be), or ``None`` when they can.

    For the commands' up-front checks of an output path, so that one under a file, or in a directory
    this process may not write, is one clear error before any work instead of an ``OSError`` half way.
    Creates nothing: ``directory``, or the nearest ancestor that exists (it would be created under that
    one), must be a directory this process may write into and enter.
    """
    directory = Path(directory)
    existing = directory
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    below = "" if existing == directory else ", so nothing can be created under it"
    if not existing.is_dir():
        return f"{existing} is {'a file, ' if existing.is_file() else ''}not a directory{below}"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the directory {existing} is not writable{below}"
    return None


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


# What a JSON document of this subsystem (plan, manifest, build state, start message) may be: plans are
# a few KB (a released stateful plan with its cache layout about 60 KB) and nest about 6 levels.
MAX_JSON_BYTES = 16 << 20


def parse_json(text: bytes | str, what: str, error: type[Exception], remedy: str) -> Any:
    """Parse untrusted JSON: ``error`` naming ``what`` and ``remedy`` if it is not UTF-8 JSON, too big or too deep.

    Never anything else: a hostile document cannot raise ``UnicodeDecodeError`` or ``RecursionError``
    past this function, and what it returns nests at most :data:`MAX_JSON_DEPTH` levels, so callers
    may walk it recursively.
    """
    if len(text) > MAX_JSON_BYTES:
        raise error(f"{what} is {len(text)} bytes, over the {MAX_JSON_BYTES} a JSON document may be; {remedy}")
    try:
        payload = json.loads(text)
    except RecursionError as exc:
        raise error(f"{what} nests deeper than Python can parse; {remedy}") from exc
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise error(f"{what} is not readable JSON ({exc}); {remedy}") from exc
    if json_depth(payload) > MAX_JSON_DEPTH:
        raise error(f"{what} nests deeper than {MAX_JSON_DEPTH} levels; {remedy}")
    return payload


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> bytes:
    """At most ``limit + 1`` bytes of ``path``: enough to tell that a file is too big without reading all of it."""
    with open(path, "rb") as handle:
        return handle.read(limit + 1)


def read_json_file(
    path: str | os.PathLike[str], default_name: str, error: type[Exception], missing: str, remedy: str
) -> tuple[Path, Any]:
    """``(path, payload)`` of the JSON file at ``path``, or of ``default_name`` inside it when it is a directory.

    Raises ``error(missing.format(path=...))`` when there is no such file and ``error`` naming the
    file, the parse error and ``remedy`` when it is not readable JSON, over :data:`MAX_JSON_BYTES`
    or nested over :data:`MAX_JSON_DEPTH` levels (:func:`parse_json`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / default_name
    if not path.is_file():
        raise error(missing.format(path=path))
    try:
        text = read_bounded(path)
    except OSError as exc:
        raise error(f"{path} is not readable ({exc}); {remedy}") from exc
    return path, parse_json(text, str(path), error, remedy)


def remove_partial_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the ``.<stem>.<random>.partial<suffix>`` temporaries a killed :func:`write_atomically` left.

    Builders call it when they start in their output directory (one build per directory at a time),
    so a killed build's half-written files are never served or copied with the plan. Returns what it removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.glob(".*.partial*"):
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def starts_with(path: str | os.PathLike[str], prefix: bytes) -> bool:
    """Whether the file at ``path`` begins with ``prefix`` (``False`` when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(prefix)) == prefix
    except OSError:
        return False


def json_schema_of(path: str | os.PathLike[str]) -> Any:
    """The ``schema`` field of the JSON object in ``path``, or ``None`` when it is not one (bounded read)."""
    try:
        payload = json.loads(read_bounded(path))
    except (OSError, RecursionError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return payload.get("schema") if isinstance(payload, dict) else None
