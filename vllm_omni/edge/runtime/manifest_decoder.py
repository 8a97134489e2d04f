"""Open a directory of windowed programs (``manifest.json`` + ``.pte``/``.pt2``) as a stream decoder.

Each file is checked against the manifest (size, sha256) before a runtime sees it, and its backend
checks that the program describes itself as the manifest's window contract, so a file from another
export is refused with a clear error instead of decoding the wrong audio. A plan directory opens
with :func:`.open.open_decoder`; this is for a bare export (``python -m vllm_omni.edge.decoder_export``).
"""

from __future__ import annotations

import os

from ..backends.interface import BackendUnavailableError, WindowRunner, graph_kinds
from ..backends.registry import get_backend
from ..plan.manifest import ManifestError, ProgramEntry, WindowedManifest
from .windowed_decoder import WindowedDecoder


def open_window_runner(manifest: WindowedManifest, entry: ProgramEntry, check_sha256: bool = True) -> WindowRunner:
    try:
        backend = get_backend(manifest.backend)
    except BackendUnavailableError as exc:
        raise ManifestError(f"no runtime for backend {manifest.backend!r}: {exc}") from exc
    if "windowed" not in graph_kinds(backend):
        raise ManifestError(f"backend {manifest.backend!r} does not run windowed programs")
    path = manifest.verify_program(entry, check_sha256=check_sha256)
    if entry.method is None:
        return backend.open_window_runner(path, manifest.contract(entry))
    return backend.open_window_runner(path, manifest.contract(entry), entry.method)


def open_windowed_decoder(path: str | os.PathLike[str], check_sha256: bool = True) -> WindowedDecoder:
    """A :class:`WindowedDecoder` over the programs of the manifest at ``path`` (file or directory)."""
    manifest = WindowedManifest.read(path)
    runners = {
        window: open_window_runner(manifest, manifest.program(window), check_sha256) for window in manifest.schedule
    }
    return WindowedDecoder(runners, ramp=manifest.ramp, context_frames=manifest.context_frames, codec=manifest.codec)
