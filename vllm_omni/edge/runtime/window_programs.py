"""Open a directory of windowed programs (``manifest.json`` + ``.pte``/``.pt2``) as a stream decoder.

Each file is checked against the manifest (size, sha256) before a runtime sees it, and the
program's own metadata (its constant methods, or the ``.pt2`` extra file) must agree with the
manifest entry, so a file from another export is refused with a clear error instead of decoding
the wrong audio.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..backends.executorch import load_pte
from ..backends.torch_export import load_pt2
from ..manifest import ManifestError, ProgramEntry, WindowedManifest
from ..window_schedule import Window
from .windowed_decoder import WindowedDecoder


def expected_metadata(window: Window, samples_per_frame: int, num_quantizers: int, sample_rate: int) -> dict[str, int]:
    """What a window program must say about itself (its constant methods, or the ``.pt2`` extra file)."""
    return {
        "context_frames": window.context_frames,
        "chunk_frames": window.chunk_frames,
        "samples_per_frame": samples_per_frame,
        "num_quantizers": num_quantizers,
        "sample_rate": sample_rate,
    }


def manifest_metadata(entry: ProgramEntry, manifest: WindowedManifest) -> dict[str, int]:
    return expected_metadata(entry.window, manifest.samples_per_frame, manifest.num_quantizers, manifest.sample_rate)


def _check_metadata(expected: dict[str, int], metadata: dict[str, int], path: Path) -> None:
    wrong = {key: (value, metadata.get(key)) for key, value in expected.items() if metadata.get(key) != value}
    if wrong:
        details = ", ".join(f"{key}: expected {want}, program says {have}" for key, (want, have) in wrong.items())
        raise ManifestError(f"{path} does not describe itself as expected ({details}); re-export")


class ExecuTorchWindowRunner:
    """A ``.pte`` window in the ExecuTorch runtime. Inputs and outputs cross as torch tensors (its API)."""

    def __init__(self, path: str | os.PathLike[str], window: Window, expected: dict[str, int]):
        import torch

        self._torch = torch
        self.window = window
        self.path = Path(path)
        self._method, metadata = load_pte(self.path)
        _check_metadata(expected, metadata, self.path)

    def run(self, codes: np.ndarray) -> np.ndarray:
        (audio,) = self._method.execute([self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))])
        return audio.numpy().ravel()


class TorchExportWindowRunner:
    """A ``.pt2`` window run by torch (``torch.export.load(...).module()``)."""

    def __init__(self, path: str | os.PathLike[str], window: Window, expected: dict[str, int]):
        import torch

        self._torch = torch
        self.window = window
        self.path = Path(path)
        exported, metadata = load_pt2(self.path)
        _check_metadata(expected, metadata, self.path)
        self._module = exported.module()

    def run(self, codes: np.ndarray) -> np.ndarray:
        with self._torch.no_grad():
            audio = self._module(self._torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)))
        return audio.numpy().ravel()


WINDOW_RUNNERS = {"executorch": ExecuTorchWindowRunner, "torch_export": TorchExportWindowRunner}


def open_window_runner(manifest: WindowedManifest, entry: ProgramEntry, check_sha256: bool = True):
    if manifest.backend not in WINDOW_RUNNERS:
        raise ManifestError(f"no runtime for backend {manifest.backend!r}; known: {', '.join(WINDOW_RUNNERS)}")
    path = manifest.verify_program(entry, check_sha256=check_sha256)
    return WINDOW_RUNNERS[manifest.backend](path, entry.window, manifest_metadata(entry, manifest))


def open_windowed_decoder(path: str | os.PathLike[str], check_sha256: bool = True) -> WindowedDecoder:
    """A :class:`WindowedDecoder` over the programs of the manifest at ``path`` (file or directory)."""
    manifest = WindowedManifest.read(path)
    runners = {
        window: open_window_runner(manifest, manifest.program(window), check_sha256) for window in manifest.schedule
    }
    return WindowedDecoder(
        runners,
        ramp=manifest.ramp,
        context_frames=manifest.context_frames,
        num_quantizers=manifest.num_quantizers,
        codebook_size=manifest.codebook_size,
        samples_per_frame=manifest.samples_per_frame,
        sample_rate=manifest.sample_rate,
    )
