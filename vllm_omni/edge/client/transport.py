"""Where a client's stream and plan come from: stdin, a file or a URL; plans downloaded once and checked.

A plan URL (``.../exec_plan.json`` or its directory) is fetched into a cache directory named by
the plan's id, each artifact downloaded once and checked against the plan's size and sha256.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import BinaryIO

from ..errors import EdgeError
from ..files import check_file, file_matches, write_atomically
from ..plan.model import PLAN_NAME, ExecPlan
from ..plan.schema import ExecPlanError

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "vllm-omni-edge" / "plans"
NETWORK_TIMEOUT_S = 30.0


def _is_url(location: str) -> bool:
    return urllib.parse.urlparse(location).scheme in ("http", "https")


def open_stream(location: str) -> BinaryIO:
    """A readable byte stream: ``-`` (stdin), an ``http(s)://`` URL, or a recorded file."""
    if location == "-":
        return sys.stdin.buffer
    if _is_url(location):
        try:
            return urllib.request.urlopen(location, timeout=NETWORK_TIMEOUT_S)
        except OSError as exc:
            raise EdgeError(f"cannot open the stream {location}: {exc}") from exc
    path = Path(location)
    if not path.is_file():
        raise EdgeError(f"no stream recording at {path}")
    return open(path, "rb")


def _download(url: str, destination: Path, sha256: str | None = None, size_bytes: int | None = None) -> None:
    def write(temporary: Path) -> None:
        try:
            with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as response, open(temporary, "wb") as out:
                while block := response.read(1 << 20):
                    out.write(block)
        except OSError as exc:
            raise EdgeError(f"cannot download {url}: {exc}") from exc
        if sha256 is not None and check_file(temporary, size_bytes, sha256) is not None:
            raise ExecPlanError(f"{url}: the download does not hash to the plan's sha256 {sha256[:16]}...; not kept")

    destination.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(destination, write)


def fetch_plan(location: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> ExecPlan:
    """A validated plan from a directory, a plan file, or a URL (artifacts downloaded once, sha256-checked)."""
    if not _is_url(location):
        return ExecPlan.load(location)
    plan_url = location if location.endswith(".json") else location.rstrip("/") + "/" + PLAN_NAME
    base = plan_url.rsplit("/", 1)[0] + "/"
    staging = cache_dir / ".incoming" / PLAN_NAME
    _download(plan_url, staging)
    try:
        payload = json.loads(staging.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ExecPlanError(f"{plan_url} is not a JSON plan ({exc})") from exc
    plan = ExecPlan.from_json(payload, source=plan_url)
    directory = cache_dir / plan.plan_id
    files = [(a.file, a.sha256, a.size_bytes) for a in plan.artifacts.values()]
    files += [
        (a.source["file"], a.source["sha256"], a.source["size_bytes"]) for a in plan.artifacts.values() if a.source
    ]
    for name, sha256, size in files:
        target = directory / name
        if file_matches(target, size, sha256):
            continue
        _download(urllib.parse.urljoin(base, urllib.parse.quote(name)), target, sha256, size)
    staging.replace(directory / PLAN_NAME)
    return ExecPlan.load(directory)
