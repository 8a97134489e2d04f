"""Where a client's stream and plan come from: stdin, a file or a URL; plans downloaded once and checked.

A plan URL (``.../exec_plan.json`` or its directory) is fetched into a cache directory named by
the plan's id, each artifact downloaded once and checked against the plan's size and sha256.
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import BinaryIO

from ..errors import ClientError
from ..files import MAX_JSON_BYTES, check_file, parse_json, write_atomically
from ..integrity import remember, verified_sha256
from ..plan.model import PLAN_NAME, ExecPlan
from ..plan.schema import ExecPlanError
from ..stream import TruncatedStreamError

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vllm-omni-edge" / "plans"
NETWORK_TIMEOUT_S = 30.0
# Leftovers of a client killed while downloading (``.incoming-*`` staging, ``.*.partial*`` files) older
# than this are removed when a plan is fetched into the same cache; younger ones may be another client's.
STALE_DOWNLOAD_S = 3600.0


def _is_url(location: str) -> bool:
    return urllib.parse.urlparse(location).scheme in ("http", "https")


class NetworkStream:
    """A response body whose failures are typed: a cut is :class:`TruncatedStreamError`, the rest :class:`ClientError`.

    ``http.client`` raises ``IncompleteRead`` (not an ``OSError``) for a chunked body cut inside a chunk,
    ``TimeoutError`` when no byte came for ``timeout`` seconds, ``ConnectionResetError`` and friends.
    """

    def __init__(self, response: BinaryIO, url: str, timeout: float):
        self.response, self.url, self.timeout = response, url, timeout
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        try:
            block = self.response.read(size)
        except http.client.IncompleteRead as exc:
            raise TruncatedStreamError(
                f"the connection to {self.url} was cut after {self.bytes_read + len(exc.partial)} bytes, inside a "
                "chunk: the server went away"
            ) from exc
        except TimeoutError as exc:
            raise ClientError(
                f"no data from {self.url} for {self.timeout:g} s after {self.bytes_read} bytes: the server stalled "
                "(--timeout sets the limit)"
            ) from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ClientError(
                f"reading {self.url} failed after {self.bytes_read} bytes: {type(exc).__name__}: {exc}"
            ) from exc
        self.bytes_read += len(block)
        return block

    def close(self) -> None:
        self.response.close()


def _urlopen(url: str, timeout: float, what: str):
    try:
        return urllib.request.urlopen(url, timeout=timeout)
    except TimeoutError as exc:
        raise ClientError(f"cannot open {what} {url}: no answer in {timeout:g} s") from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ClientError(f"cannot open {what} {url}: {type(exc).__name__}: {exc}") from exc


def open_stream(location: str, timeout: float = NETWORK_TIMEOUT_S) -> BinaryIO:
    """A readable byte stream: ``-`` (stdin), an ``http(s)://`` URL, or a recorded file.

    A URL's every read waits at most ``timeout`` seconds; stdin and files wait as long as they need.
    Stdin is read unbuffered from its file descriptor (see :func:`_stdin_stream`).
    """
    if location == "-":
        return _stdin_stream()
    if _is_url(location):
        return NetworkStream(_urlopen(location, timeout, "the stream"), location, timeout)
    path = Path(location)
    if not path.is_file():
        raise ClientError(f"no stream recording at {path}")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ClientError(f"cannot read the stream recording {path}: {exc}") from exc


def _stdin_stream() -> BinaryIO:
    """Standard input as an unbuffered reader of its file descriptor (closing it leaves the descriptor open).

    The client reads its stream in a daemon thread. Blocked in ``sys.stdin.buffer.read``, that thread
    would hold the buffer's lock, and an interpreter exiting under it (Ctrl-C, SIGTERM, an error)
    aborts with "could not acquire lock for <_io.BufferedReader name='<stdin>'>". A raw read holds
    no lock; short reads are fine, the record reader loops until it has what it asked for.
    """
    if sys.stdin is None:
        raise ClientError("--stream -: this process has no standard input; give a recording file or a URL")
    try:
        return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    except (OSError, ValueError) as exc:
        raise ClientError(f"--stream -: cannot read standard input: {exc}") from exc


def _download(
    url: str, destination: Path, sha256: str | None, size_bytes: int, timeout: float = NETWORK_TIMEOUT_S
) -> None:
    """Download ``url`` to ``destination`` (atomically); at most ``size_bytes`` bytes, then the sha256 if given.

    A body longer than ``size_bytes`` is refused as soon as it is: nothing beyond it is read or written.
    """

    def write(temporary: Path) -> None:
        body = NetworkStream(_urlopen(url, timeout, "the plan file"), url, timeout)
        try:
            with open(temporary, "wb") as out:
                while block := body.read(min(1 << 20, size_bytes + 1 - body.bytes_read)):
                    out.write(block)
                    if body.bytes_read > size_bytes:
                        raise ExecPlanError(
                            f"{url}: the server sent more than the {size_bytes} bytes the plan declares; not kept"
                        )
        except OSError as exc:
            raise ClientError(f"cannot write {destination}: {exc}") from exc
        finally:
            body.close()
        if sha256 is not None and check_file(temporary, size_bytes, sha256) is not None:
            raise ExecPlanError(f"{url}: the download does not hash to the plan's sha256 {sha256[:16]}...; not kept")

    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClientError(f"cannot create the plan cache {destination.parent}: {exc}") from exc
    write_atomically(destination, write)
    if sha256 is not None:  # just hashed: the plan's validation need not read it again
        remember(destination, sha256)


def remove_stale_downloads(cache_dir: Path, older_than_s: float = STALE_DOWNLOAD_S) -> None:
    """Remove what killed clients left in ``cache_dir``: ``.incoming*`` staging and ``.*.partial*`` files."""
    if not cache_dir.is_dir():
        return
    cutoff = time.time() - older_than_s
    leftovers = [*cache_dir.glob(".incoming*"), *cache_dir.glob("*/.*.partial*")]
    for path in leftovers:
        try:
            if path.lstat().st_mtime >= cutoff:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            continue  # another client removed it first


def fetch_plan(location: str, cache_dir: Path = DEFAULT_CACHE_DIR, timeout: float = NETWORK_TIMEOUT_S) -> ExecPlan:
    """A validated plan from a directory, a plan file, or a URL (artifacts downloaded once, sha256-checked).

    A URL's plan is at most :data:`~vllm_omni.edge.files.MAX_JSON_BYTES` and each artifact at most its
    declared ``size_bytes``; every read waits at most ``timeout`` seconds. Nothing half-downloaded is
    left behind: staging and partial files are removed on failure (and, for a killed client, by the
    next fetch into the same cache).
    """
    if not _is_url(location):
        return ExecPlan.load(location)
    plan_url = location if location.endswith(".json") else location.rstrip("/") + "/" + PLAN_NAME
    base = plan_url.rsplit("/", 1)[0] + "/"
    remove_stale_downloads(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging_dir = Path(tempfile.mkdtemp(prefix=".incoming-", dir=cache_dir))
    except OSError as exc:
        raise ClientError(f"cannot create the plan cache {cache_dir}: {exc}") from exc
    try:
        staging = staging_dir / PLAN_NAME
        _download(plan_url, staging, None, MAX_JSON_BYTES, timeout)
        payload = parse_json(staging.read_bytes(), plan_url, ExecPlanError, "is the URL a plan's?")
        plan = ExecPlan.from_json(payload, source=plan_url)
        directory = cache_dir / plan.plan_id
        for record in plan.files().values():  # roles may share a file: fetched once
            target = directory / record.file
            if check_file(target, record.size_bytes, record.sha256, sha256_of=verified_sha256) is None:
                continue
            url = urllib.parse.urljoin(base, urllib.parse.quote(record.file))
            _download(url, target, record.sha256, record.size_bytes, timeout)
        os.replace(staging, directory / PLAN_NAME)
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return ExecPlan.load(directory)
