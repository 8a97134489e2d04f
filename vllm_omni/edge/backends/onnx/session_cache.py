"""The device's cache of onnxruntime-optimized step graphs: pay for graph optimization once per device.

onnxruntime's full optimization (level ``ALL``: fusions, the NCHWc layout of convolutions) is
what makes the CPU step fast. For the released graph it costs 1-2 s at every session creation.
Its result depends on this CPU (NCHWc block size, instruction set) and on the onnxruntime version,
so it cannot be done once at build time for every device. It is done on the device instead:

- **miss**: the session is created at level ``ALL`` from the plan's graph, and onnxruntime saves the
  optimized model (``model.onnx`` + its weights in ``weights.bin``) into a fresh entry;
- **hit**: the saved model is loaded with optimization off, its weights memory-mapped.

An entry is keyed by the graph's verified sha256, the onnxruntime version and a signature of this
CPU's features. Its files are recorded (size + sha256) when written and checked like plan
artifacts (by identity, :mod:`...integrity`) before every load, so a damaged or altered entry is
rebuilt, never run. At most :data:`MAX_ENTRIES` entries are kept (least recently used dropped).
A cache that cannot be written (read-only, full) only costs speed: the session is then made as
without a cache. ``VLLM_OMNI_EDGE_ORT_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import shutil
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

from ...errors import EdgeError
from ...files import check_file, file_sha256, parse_json, read_bounded, write_json_atomically
from ...integrity import cache_dir, remember, verified_sha256

logger = logging.getLogger(__name__)

CACHE_ENV = "VLLM_OMNI_EDGE_ORT_CACHE"
MAX_ENTRIES = 4
MODEL_NAME, WEIGHTS_NAME, RECORD_NAME = "model.onnx", "weights.bin", "entry.json"
CPU = ["CPUExecutionProvider"]
STALE_STAGING_SECONDS = 3600


class _EntryError(Exception):
    pass


def onnxruntime_module():
    try:
        import onnxruntime
    except ImportError as exc:
        raise EdgeError("onnxruntime is not installed: pip install 'vllm-omni-edge[onnx]' (or onnxruntime)") from exc
    return onnxruntime


def session_options(threads: int | None, level: str = "ORT_ENABLE_ALL", prepack: bool = False) -> Any:
    """Fresh onnxruntime session options for a step graph: ``threads`` intra-op threads (``None``: default).

    Memory-reuse planning is off: for the released graph it took about 0.9 s of every open and
    measured no difference in peak RSS or speed (the arena still recycles freed buffers). Weight
    prepacking is off unless ``prepack``: it costs about 0.4 s per open for about 8% faster steps.
    """
    ort = onnxruntime_module()
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.enable_mem_reuse = False
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    # Errors only: at level ALL onnxruntime warns for every initializer its own folding leaves unused, and
    # that a saved NCHWc model is CPU-specific (which is why cache entries are keyed by this CPU).
    options.log_severity_level = 3
    return options


@cache
def cpu_signature() -> str:
    """A short digest of what decides an optimized graph's layout: machine, and the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        flags = platform.processor()
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:12]


class OptimizedModelCache:
    """Optimized step graphs under ``root`` (``None``: no cache, every session is optimized in memory)."""

    def __init__(self, root: str | os.PathLike[str] | None):
        self.root = Path(root) if root is not None else None

    @classmethod
    def default(cls) -> OptimizedModelCache:
        if os.environ.get(CACHE_ENV, "1") == "0":
            return cls(None)
        return cls(cache_dir() / "onnxruntime")

    def entry(self, sha256: str) -> Path:
        ort = onnxruntime_module()
        return self.root / f"{sha256[:32]}-ort{ort.__version__}-{cpu_signature()}"

    def session(self, graph: Path, sha256: str, threads: int | None = None, prepack: bool = False) -> tuple[Any, bool]:
        """``(session, hit)`` for the graph at ``graph``, already verified to hash to ``sha256``."""
        ort = onnxruntime_module()
        if self.root is None:
            return ort.InferenceSession(str(graph), session_options(threads, prepack=prepack), providers=CPU), False
        entry = self.entry(sha256)
        try:
            model = self._verified_model(entry)
        except _EntryError as exc:
            if entry.exists():
                logger.warning("onnxruntime cache entry %s is damaged (%s); rebuilding it", entry.name, exc)
            return self._build(graph, entry, threads, prepack), False
        try:
            session = ort.InferenceSession(
                str(model), session_options(threads, "ORT_DISABLE_ALL", prepack), providers=CPU
            )
        except Exception as exc:  # onnxruntime's own error types: an entry it cannot load is rebuilt
            logger.warning("onnxruntime cannot load cache entry %s (%s); rebuilding it", entry.name, exc)
            return self._build(graph, entry, threads, prepack), False
        with contextlib.suppress(OSError):
            os.utime(entry)  # the least recently used entry is dropped first
        return session, True

    def _verified_model(self, entry: Path) -> Path:
        record_path = entry / RECORD_NAME
        try:
            record = parse_json(read_bounded(record_path), str(record_path), _EntryError, "")
        except OSError as exc:
            raise _EntryError(f"no record ({exc.strerror})") from exc
        files = record.get("files") if isinstance(record, dict) else None
        if not isinstance(files, dict) or set(files) != {MODEL_NAME, WEIGHTS_NAME}:
            raise _EntryError("the record does not list the model and its weights")
        for name, row in files.items():
            if not isinstance(row, dict):
                raise _EntryError(f"the record of {name} is not an object")
            mismatch = check_file(entry / name, row.get("size_bytes"), row.get("sha256"), sha256_of=verified_sha256)
            if mismatch is not None:
                raise _EntryError(f"{name}: {mismatch.field} differs from the record")
        return entry / MODEL_NAME

    def _build(self, graph: Path, entry: Path, threads: int | None, prepack: bool) -> Any:
        ort = onnxruntime_module()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".incoming-"))
        except OSError as exc:
            logger.warning("onnxruntime cache %s is not writable (%s); optimizing in memory", self.root, exc)
            return ort.InferenceSession(str(graph), session_options(threads, prepack=prepack), providers=CPU)
        start = time.perf_counter()
        try:
            options = session_options(threads, prepack=prepack)
            options.optimized_model_filepath = str(staging / MODEL_NAME)
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", WEIGHTS_NAME)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            session = ort.InferenceSession(str(graph), options, providers=CPU)
            try:
                self._store(staging, entry, graph)
            except OSError as exc:  # the session is fine; only the next open pays again
                logger.warning("could not cache the optimized graph in %s (%s)", self.root, exc)
                return session
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info("optimized %s for this CPU in %.1f s; cached in %s", graph.name, time.perf_counter() - start, entry)
        self._evict(keep=entry)
        return session

    @staticmethod
    def _store(staging: Path, entry: Path, graph: Path) -> None:
        """Record the staged files and move them into place as ``entry`` (replacing a damaged one)."""
        files = {}
        for name in (MODEL_NAME, WEIGHTS_NAME):
            path = staging / name
            files[name] = {"sha256": file_sha256(path), "size_bytes": path.stat().st_size}
        write_json_atomically(staging / RECORD_NAME, {"graph": graph.name, "files": files})
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
        for name, row in files.items():  # hashed once, remembered at the final path (the rename keeps the inode)
            remember(entry / name, row["sha256"])

    def _evict(self, keep: Path) -> None:
        """Keep the :data:`MAX_ENTRIES` most recently used entries; drop staging a killed process left."""
        now, entries = time.time(), []
        for path in self.root.iterdir():
            try:
                if path.name.startswith(".incoming-") and now - path.stat().st_mtime > STALE_STAGING_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)
                elif path.is_dir() and not path.name.startswith(".") and path != keep:
                    entries.append((path.stat().st_mtime, path))
            except OSError:
                continue
        for _, stale in sorted(entries, reverse=True)[MAX_ENTRIES - 1 :]:
            shutil.rmtree(stale, ignore_errors=True)
