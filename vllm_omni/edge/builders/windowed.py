"""Export the windowed programs a stream needs, verify each one, and describe them in ``manifest.json``.

One fixed-shape program per window of the schedule (:mod:`..graphs.window_contract`): a file each,
or with ``one_program`` (executorch) one ``windows.pte`` holding a method per window, lowered
together so the weights are stored once (what ``npu_phone`` ships). Resumable: after
each program the work done so far is recorded in ``.export-state.json`` (:mod:`.state`); a re-run with the same
inputs (checkpoint bytes, backend, partitioner, dtype, window) keeps every program whose file is
still intact (same sha256) and only does the rest. Programs and the manifest are written through
temporary names, so an interrupted run never leaves a file that looks finished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE, Qwen3TTSTokenizerV2Decoder

from ..audio import snr_db
from ..backends.interface import ProgramWriter
from ..backends.registry import get_backend, program_writer
from ..backends.torch_export.export import quiet_torch_export
from ..checkpoint import checkpoint_sha256, load_code2wav_decoder, model_label, resolve_speech_tokenizer
from ..errors import EdgeExportError
from ..files import file_sha256, json_schema_of, read_bounded, remove_partial_files
from ..geometry import CodecGeometry
from ..graphs.window_contract import INPUT_NAME, OUTPUT_NAME, Window, check_ramp, window_schedule
from ..graphs.windowed import WindowedCode2Wav
from ..hardware.registry import HardwareClass
from ..plan.construct import windowed_plan
from ..plan.manifest import MANIFEST_NAME, MANIFEST_SCHEMA, ProgramEntry, TensorSpec, WindowedManifest
from ..plan.model import ExecPlan
from .plans import write_and_load
from .request import BuildRequest, check_out_dir, class_default
from .state import BuildState, tool_versions

logger = logging.getLogger(__name__)

STATE_NAME = ".export-state.json"
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
    force: bool = False  # replace a manifest.json in out_dir that this tool did not write
    one_program: bool = False  # one file with a method per window (the weights once) instead of a file each


def check_against_eager(
    wrapper: WindowedCode2Wav, path: Path, entry: ProgramEntry, manifest: WindowedManifest, tolerance: float
) -> dict[str, Any]:
    """Run the written program in its runtime on random codes and compare with eager; raise over tolerance."""
    (codes,) = wrapper.example_inputs(seed=1234)
    with torch.no_grad():
        reference = wrapper(codes).numpy().ravel()
    backend = get_backend(manifest.backend)
    if entry.method is None:
        runner = backend.open_window_runner(path, manifest.contract(entry))
    else:
        runner = backend.open_window_runner(path, manifest.contract(entry), entry.method)
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


def export_windowed_programs(
    request: WindowedExportRequest,
    decoder: Qwen3TTSTokenizerV2Decoder | None = None,
    progress: Callable[[str], None] = logger.info,
) -> WindowedManifest:
    """Export, verify and describe every program of ``request``; returns the manifest written to ``out_dir``.

    Arguments are checked (ramp, context, backend, partitioner, dtype) before the model is loaded.
    """
    check_out_dir(request.out_dir, request.force)
    ramp = check_ramp(request.ramp, request.context_frames)
    schedule = window_schedule(ramp, request.context_frames)
    backend = program_writer(request.backend, request.partitioner)
    if request.one_program and not hasattr(backend, "write_methods"):
        raise EdgeExportError(
            f"--one-program: the {backend.name} backend writes one window per file; one program holding every "
            "window needs --backend executorch"
        )
    if request.dtype not in DTYPES:
        raise EdgeExportError(f"unknown dtype {request.dtype!r}; known: {', '.join(DTYPES)}")
    tolerance = request.tolerance if request.tolerance is not None else DEFAULT_TOLERANCE[request.dtype]

    files = resolve_speech_tokenizer(request.model)  # once: a hub id is not fetched twice
    if decoder is None:
        decoder = load_code2wav_decoder(files.directory, DTYPES[request.dtype])
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_files(out_dir)  # a killed run's half-written programs
    fingerprint = {
        "checkpoint_sha256": checkpoint_sha256(files),
        "backend": backend.name,
        "partitioner": backend.partitioner,
        "dtype": request.dtype,
    }
    # An existing manifest stays until the new one replaces it (atomically, at the end): a killed run
    # leaves the old one, whose size + sha256 records refuse any program this run has replaced since.
    state = BuildState(out_dir / STATE_NAME, fingerprint, "programs")

    config = decoder.config
    skeleton = WindowedManifest(
        model_id=model_label(request.model),
        checkpoint_sha256=fingerprint["checkpoint_sha256"],
        geometry=dataclasses.asdict(config),
        codec=CodecGeometry.of_decoder(decoder, OUTPUT_SAMPLE_RATE),
        ramp=ramp,
        context_frames=request.context_frames,
        backend=backend.name,
        partitioner=backend.partitioner,
        dtype=request.dtype,
        programs=(),
        tools=tool_versions("torch", "executorch"),
        directory=out_dir,
    )
    if request.one_program:
        entries = _one_program(decoder, schedule, backend, skeleton, state, request.check, tolerance, progress)
        manifest = dataclasses.replace(skeleton, programs=tuple(entries))
        path = manifest.write(out_dir)
        progress(f"wrote {path} ({len(entries)} windows in {entries[0].path})")
        return manifest
    entries = []
    for index, window in enumerate(schedule, start=1):
        label = (
            f"[{index}/{len(schedule)}] {window.name} (context {window.context_frames} + chunk {window.chunk_frames})"
        )
        row = state.intact(window.name, lambda row: out_dir / row["path"])
        entry = _entry_of(row)
        wrapper = WindowedCode2Wav(decoder, window).eval()
        if entry is not None:
            progress(f"{label}: kept {entry.path} ({entry.size_bytes / 1e6:.1f} MB, intact)")
        else:
            entry = _export_one(wrapper, window, backend, out_dir, progress, label)
        if request.check:  # kept programs too: verification, not hope
            entry = _checked(wrapper, out_dir / entry.path, entry, skeleton, tolerance)
            progress(
                f"{label}: checked in {backend.name}: max|diff| {entry.check['max_abs_diff']:.2e}, "
                f"SNR {entry.check['snr_db']:.1f} dB vs eager"
            )
        entries.append(entry)
        state.record(window.name, entry.to_json())

    manifest = dataclasses.replace(skeleton, programs=tuple(entries))
    path = manifest.write(out_dir)
    progress(f"wrote {path} ({len(entries)} programs)")
    return manifest


def _checked(
    wrapper: WindowedCode2Wav, path: Path, entry: ProgramEntry, skeleton: WindowedManifest, tolerance: float
) -> ProgramEntry:
    """``entry`` with its check against eager; a program that fails it is deleted (and unlisted) first."""
    try:
        check = check_against_eager(wrapper, path, entry, skeleton, tolerance)
    except EdgeExportError:
        path.unlink(missing_ok=True)
        _drop_manifest_naming(skeleton.directory, entry.path)
        raise
    return dataclasses.replace(entry, check=check)


ONE_PROGRAM_STEM = "windows"


def _one_program(
    decoder: Qwen3TTSTokenizerV2Decoder,
    schedule: tuple[Window, ...],
    backend: ProgramWriter,
    skeleton: WindowedManifest,
    state: BuildState,
    check: bool,
    tolerance: float,
    progress: Callable[[str], None],
) -> list[ProgramEntry]:
    """Every window as a method of one program (kept when intact), each method checked against eager."""
    out_dir = skeleton.directory
    path = out_dir / f"{ONE_PROGRAM_STEM}{backend.suffix}"
    label = f"{len(schedule)} windows ({', '.join(w.name for w in schedule)})"
    wrappers = {window.name: WindowedCode2Wav(decoder, window).eval() for window in schedule}
    record = state.intact(path.name, lambda row: out_dir / row["path"])
    entries = [_entry_of(row) for row in record.get("windows", [])] if record is not None else []
    if record is not None and [e.name if e else None for e in entries] == [w.name for w in schedule]:
        progress(f"{label}: kept {path.name} ({path.stat().st_size / 1e6:.1f} MB, intact)")
    else:
        entries = _export_methods(wrappers, schedule, backend, path, progress, label)
    checked = []
    for entry in entries:
        if check:  # kept programs too: verification, not hope
            entry = _checked(wrappers[entry.name], path, entry, skeleton, tolerance)
            progress(
                f"{entry.name}: method of {path.name} checked in {backend.name}: max|diff| "
                f"{entry.check['max_abs_diff']:.2e}, SNR {entry.check['snr_db']:.1f} dB vs eager"
            )
        checked.append(entry)
    state.record(
        path.name,
        {
            "path": path.name,
            "size_bytes": checked[0].size_bytes,
            "sha256": checked[0].sha256,
            "windows": [entry.to_json() for entry in checked],
        },
    )
    return checked


def _export_methods(
    wrappers: dict[str, WindowedCode2Wav],
    schedule: tuple[Window, ...],
    backend: ProgramWriter,
    path: Path,
    progress: Callable[[str], None],
    label: str,
) -> list[ProgramEntry]:
    started = time.perf_counter()
    methods = {}
    try:
        with torch.no_grad(), quiet_torch_export():
            for window in schedule:
                wrapper = wrappers[window.name]
                exported = torch.export.export(wrapper, wrapper.example_inputs())
                methods[window.name] = (exported, wrapper.contract.metadata())
            export_seconds = time.perf_counter() - started
            progress(f"{label}: exported in {export_seconds:.1f} s; lowering them together into {path.name}")
            ops = backend.write_methods(methods, path)
    except EdgeExportError:
        raise
    except Exception as exc:  # the toolchains raise many types; name the stage
        raise EdgeExportError(
            f"{label}: {backend.name} export into one program failed: {type(exc).__name__}: {exc}"
        ) from exc
    seconds = time.perf_counter() - started
    size, sha256 = path.stat().st_size, file_sha256(path)
    progress(f"{label}: wrote {path.name} ({size / 1e6:.1f} MB) in {seconds:.1f} s (export {export_seconds:.1f} s)")
    for method_ops in ops.values():
        if isinstance(method_ops, dict) and "delegation" in method_ops:
            progress(method_ops["delegation"]["summary"])
    return [
        ProgramEntry(
            name=window.name,
            context_frames=window.context_frames,
            chunk_frames=window.chunk_frames,
            path=path.name,
            size_bytes=size,
            sha256=sha256,
            inputs=(TensorSpec(INPUT_NAME, wrappers[window.name].contract.input_shape(), "int64"),),
            outputs=(TensorSpec(OUTPUT_NAME, wrappers[window.name].contract.output_shape(), "float32"),),
            export_seconds=round(seconds, 2),
            ops=ops[window.name],
            method=window.name,
        )
        for window in schedule
    ]


def _drop_manifest_naming(out_dir: Path, program: str) -> None:
    """Remove this tool's ``manifest.json`` in ``out_dir`` if it lists ``program`` (just removed as failed):
    a manifest naming a file that is gone must not look finished. Any other manifest is left alone."""
    path = out_dir / MANIFEST_NAME
    if json_schema_of(path) != MANIFEST_SCHEMA:
        return
    try:
        payload = json.loads(read_bounded(path))
        names = {row.get("path") for row in payload.get("programs", []) if isinstance(row, dict)}
    except (OSError, RecursionError, ValueError, AttributeError, TypeError):
        names = set()
    if program in names:
        path.unlink(missing_ok=True)


def _entry_of(row: dict[str, Any] | None) -> ProgramEntry | None:
    """The kept program a state record describes, or ``None`` when the record is damaged (then it is rebuilt)."""
    if row is None:
        return None
    try:
        return ProgramEntry.from_json(row)
    except (KeyError, TypeError, ValueError):
        return None


def _export_one(
    wrapper: WindowedCode2Wav,
    window: Window,
    backend: ProgramWriter,
    out_dir: Path,
    progress: Callable[[str], None],
    label: str,
) -> ProgramEntry:
    path = out_dir / f"{window.name}{backend.suffix}"
    started = time.perf_counter()
    try:
        with torch.no_grad(), quiet_torch_export():
            exported = torch.export.export(wrapper, wrapper.example_inputs())
            export_seconds = time.perf_counter() - started
            ops = backend.write_program(exported, wrapper.contract.metadata(), path)
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
        inputs=(TensorSpec(INPUT_NAME, wrapper.contract.input_shape(), "int64"),),
        outputs=(TensorSpec(OUTPUT_NAME, wrapper.contract.output_shape(), "float32"),),
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


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """The class's windowed programs (its ramp, context, backend and partitioner unless the request says
    otherwise), each checked against eager, and the windowed plan over them."""
    manifest = export_windowed_programs(
        WindowedExportRequest(
            model=request.model,
            out_dir=request.out_dir,
            ramp=tuple(class_default(request.ramp, hardware_class, "ramp")),
            context_frames=class_default(request.context_frames, hardware_class, "context_frames"),
            backend=hardware_class.backend,
            partitioner=class_default(request.partitioner, hardware_class, "partitioner"),
            dtype=hardware_class.dtype,
            check=request.check,
            force=request.force,
            one_program=bool(class_default(None, hardware_class, "one_program")),
        ),
        progress=request.progress,
    )
    plan = windowed_plan(manifest, hardware_class=hardware_class.name, device_dir=request.device_dir)
    return write_and_load(plan, request)
