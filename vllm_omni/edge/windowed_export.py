"""Export the windowed programs a stream needs, verify each one, and describe them in ``manifest.json``.

One fixed-shape program per window of the schedule (:mod:`.window_schedule`). Resumable: after
each program the work done so far is recorded in ``.export-state.json``; a re-run with the same
inputs (checkpoint bytes, backend, partitioner, dtype, window) keeps every program whose file is
still intact (same sha256) and only does the rest. Programs and the manifest are written through
temporary names, so an interrupted run never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder

from .audio import snr_db
from .backends.programs import ProgramBackend, program_backend
from .checkpoint import checkpoint_sha256, resolve_speech_tokenizer
from .errors import EdgeExportError
from .files import file_matches, file_sha256, write_json_atomically
from .manifest import MANIFEST_NAME, ProgramEntry, WindowedManifest
from .runtime.window_programs import WINDOW_RUNNERS, manifest_metadata
from .window_schedule import Window, check_ramp, window_schedule
from .windowed import WindowedCode2Wav

logger = logging.getLogger(__name__)

STATE_NAME = ".export-state.json"
# torch 2.13's own pytree use warns once per program saved or loaded; nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
DTYPES = {"fp32": torch.float32}
# Max-abs difference against eager allowed for a program (audio is in [-1, 1]; 1e-3 is -60 dBFS).
DEFAULT_TOLERANCE = {"fp32": 1e-3}


@dataclass(frozen=True)
class WindowedExportRequest:
    model: str
    out_dir: Path
    ramp: tuple[int, ...] = (2, 4, 8, 16, 25)
    context_frames: int = 72
    backend: str = "executorch"
    partitioner: str | None = None
    dtype: str = "fp32"
    check: bool = True
    tolerance: float | None = None


def check_against_eager(
    wrapper: WindowedCode2Wav, path: Path, entry: ProgramEntry, manifest: WindowedManifest, tolerance: float
) -> dict[str, Any]:
    """Run the written program in its runtime on random codes and compare with eager; raise over tolerance."""
    (codes,) = wrapper.example_inputs(seed=1234)
    with torch.no_grad():
        reference = wrapper(codes).numpy().ravel()
    runner = WINDOW_RUNNERS[manifest.backend](path, entry.window, manifest_metadata(entry, manifest))
    started = time.perf_counter()
    produced = runner.run(codes.numpy())
    seconds = time.perf_counter() - started
    if produced.shape != reference.shape:
        raise EdgeExportError(f"{path}: the runtime returned {produced.shape} samples, eager {reference.shape}")
    max_abs = float(np.abs(produced - reference).max())
    check = {
        "runtime": manifest.backend,
        "max_abs_diff": max_abs,
        "snr_db": snr_db(reference, produced),
        "tolerance": tolerance,
        "run_seconds": round(seconds, 4),
    }
    if not max_abs <= tolerance:
        raise EdgeExportError(
            f"{path.name}: the {manifest.backend} program differs from eager by {max_abs:.3g} (max abs), over the "
            f"tolerance {tolerance:g} (SNR {check['snr_db']:.1f} dB); the file was removed. Try --partitioner none "
            "to see whether the delegate is the cause"
        )
    return check


def tool_versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` (those not installed are left out): what a build record notes."""
    versions = {}
    for name in names:
        with contextlib.suppress(package_metadata.PackageNotFoundError):
            versions[name] = package_metadata.version(name)
    return versions


def _read_state(out_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((out_dir / STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}


def export_windowed_programs(
    request: WindowedExportRequest,
    decoder: Qwen3TTSTokenizerV2Decoder | None = None,
    progress: Callable[[str], None] = logger.info,
) -> WindowedManifest:
    """Export, verify and describe every program of ``request``; returns the manifest written to ``out_dir``.

    Arguments are checked (ramp, context, backend, partitioner, dtype) before the model is loaded.
    """
    ramp = check_ramp(request.ramp, request.context_frames)
    schedule = window_schedule(ramp, request.context_frames)
    backend = program_backend(request.backend, request.partitioner)
    if request.dtype not in DTYPES:
        raise EdgeExportError(f"unknown dtype {request.dtype!r}; known: {', '.join(DTYPES)}")
    tolerance = request.tolerance if request.tolerance is not None else DEFAULT_TOLERANCE[request.dtype]

    files = resolve_speech_tokenizer(request.model)  # once: a hub id is not fetched twice
    if decoder is None:
        from .decoder_export import load_code2wav_decoder

        decoder = load_code2wav_decoder(files.directory, DTYPES[request.dtype])
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {
        "checkpoint_sha256": checkpoint_sha256(files),
        "backend": backend.name,
        "partitioner": backend.partitioner,
        "dtype": request.dtype,
    }
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)  # rewritten at the end; never stale beside new programs
    state = _read_state(out_dir)
    done: dict[str, Any] = state.get("programs", {}) if state.get("fingerprint") == fingerprint else {}

    config = decoder.config
    skeleton = WindowedManifest(
        model_id=str(request.model),
        checkpoint_sha256=fingerprint["checkpoint_sha256"],
        geometry=dataclasses.asdict(config),
        sample_rate=OUTPUT_SAMPLE_RATE,
        samples_per_frame=decoder.total_upsample,
        num_quantizers=config.num_quantizers,
        codebook_size=config.codebook_size,
        ramp=ramp,
        context_frames=request.context_frames,
        backend=backend.name,
        partitioner=backend.partitioner,
        dtype=request.dtype,
        programs=(),
        tools=tool_versions("torch", "executorch"),
        directory=out_dir,
    )
    entries = []
    for index, window in enumerate(schedule, start=1):
        label = (
            f"[{index}/{len(schedule)}] {window.name} (context {window.context_frames} + chunk {window.chunk_frames})"
        )
        entry = _kept_entry(out_dir, done.get(window.name))
        wrapper = WindowedCode2Wav(decoder, window).eval()
        if entry is not None:
            progress(f"{label}: kept {entry.path} ({entry.size_bytes / 1e6:.1f} MB, intact)")
        else:
            entry = _export_one(wrapper, window, backend, out_dir, progress, label)
        if request.check:  # kept programs too: verification, not hope
            path = out_dir / entry.path
            try:
                check = check_against_eager(wrapper, path, entry, skeleton, tolerance)
            except EdgeExportError:
                path.unlink(missing_ok=True)
                raise
            entry = dataclasses.replace(entry, check=check)
            progress(
                f"{label}: checked in {backend.name}: max|diff| {check['max_abs_diff']:.2e}, "
                f"SNR {check['snr_db']:.1f} dB vs eager"
            )
        entries.append(entry)
        done[window.name] = entry.to_json()
        write_json_atomically(out_dir / STATE_NAME, {"fingerprint": fingerprint, "programs": done})

    manifest = dataclasses.replace(skeleton, programs=tuple(entries))
    path = manifest.write(out_dir)
    progress(f"wrote {path} ({len(entries)} programs)")
    return manifest


def _kept_entry(out_dir: Path, row: dict[str, Any] | None) -> ProgramEntry | None:
    if row is None:
        return None
    entry = ProgramEntry.from_json(row)
    path = out_dir / entry.path
    if not file_matches(path, entry.size_bytes, entry.sha256):
        return None
    return entry


def _export_one(
    wrapper: WindowedCode2Wav,
    window: Window,
    backend: ProgramBackend,
    out_dir: Path,
    progress: Callable[[str], None],
    label: str,
) -> ProgramEntry:
    path = out_dir / f"{window.name}{backend.suffix}"
    started = time.perf_counter()
    try:
        with torch.no_grad():
            exported = torch.export.export(wrapper, wrapper.example_inputs())
        export_seconds = time.perf_counter() - started
        ops = backend.write_program(exported, wrapper.metadata(), path)
    except EdgeExportError:
        raise
    except Exception as exc:  # the toolchains raise many types; name the stage and the window
        raise EdgeExportError(f"{label}: {backend.name} export failed: {type(exc).__name__}: {exc}") from exc
    seconds = time.perf_counter() - started
    entry = ProgramEntry(
        name=window.name,
        context_frames=window.context_frames,
        chunk_frames=window.chunk_frames,
        path=path.name,
        size_bytes=path.stat().st_size,
        sha256=file_sha256(path),
        inputs=wrapper.input_specs(),
        outputs=wrapper.output_specs(),
        export_seconds=round(seconds, 2),
        ops=ops,
    )
    lowering = f", lowering {seconds - export_seconds:.1f} s" if backend.name != "torch_export" else ""
    delegated = f", {ops['delegated']} ops delegated / {ops['portable']} portable" if ops else ""
    progress(
        f"{label}: wrote {path.name} ({entry.size_bytes / 1e6:.1f} MB) in {seconds:.1f} s "
        f"(export {export_seconds:.1f} s{lowering}){delegated}"
    )
    return entry


def export_summary(manifest: WindowedManifest) -> str:
    """A readable table of the programs (for the CLI and the benchmark)."""
    lines = ["program | window | size MB | export s | max abs diff"]
    for entry in manifest.programs:
        diff = f"{entry.check['max_abs_diff']:.2e}" if entry.check else "unchecked"
        lines.append(
            f"{entry.name} | {entry.context_frames}+{entry.chunk_frames} | {entry.size_bytes / 1e6:.1f} | "
            f"{entry.export_seconds:.1f} | {diff}"
        )
    return "\n".join(lines)


__all__ = ["WindowedExportRequest", "export_summary", "export_windowed_programs"]
