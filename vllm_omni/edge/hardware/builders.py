"""Builders: produce, verify and describe every artifact of a hardware class, then write its plan.

Each builder is called as ``builder(hardware_class, request) -> ExecPlan`` and is resumable: an
artifact already in ``out_dir`` whose recorded sha256 still matches (and was built from the same
checkpoint) is kept and checked again instead of rebuilt. The plan is written last, and only
after it validates against the files.

- ``build_windowed``: ExecuTorch (or ``.pt2``) windowed programs via :mod:`..windowed_export`.
- ``build_onnx_steps``: stateful ONNX step graphs, each checked in onnxruntime against the full decode.
- ``build_rknn``: the same ONNX steps, compiled to fp16 ``.rknn`` and checked in the rknn-toolkit2
  simulator by ``tools/rknn/prepare_qwen3_tts_rknn_vocoder.py`` in the converter venv.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ..checkpoint import checkpoint_sha256, resolve_speech_tokenizer
from ..errors import EdgeError, EdgeExportError
from ..files import file_matches, file_sha256, write_json_atomically
from ..plan import (
    DEFAULT_DEVICE_DIR,
    ExecPlan,
    ExecPlanError,
    PlanArtifact,
    StepArtifact,
    stateful_plan,
    window_contract,
)
from .registry import HardwareClass

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
RKNN_SCRIPT = REPO_ROOT / "tools" / "rknn" / "prepare_qwen3_tts_rknn_vocoder.py"
CONVERTER_PYTHON_ENV = "VLLM_OMNI_EDGE_RKNN_PYTHON"
STATE_NAME = ".build-state.json"


@dataclass(frozen=True)
class BuildRequest:
    """What to build; ``None`` sizes take the hardware class's defaults."""

    model: str
    out_dir: Path
    target: str | None = None
    ramp: tuple[int, ...] | None = None
    context_frames: int | None = None
    partitioner: str | None = None
    step_frames: int | None = None
    first_step_frames: int | None = None  # 0: no first step
    device_dir: str = DEFAULT_DEVICE_DIR
    check: bool = True
    progress: Callable[[str], None] = field(default=logger.info, compare=False)


def _default(value: Any, hardware_class: HardwareClass, key: str) -> Any:
    return hardware_class.defaults.get(key) if value is None else value


# -- windowed (npu_phone) ---------------------------------------------------------------------------


def build_windowed(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    from ..windowed_export import WindowedExportRequest, export_windowed_programs

    manifest = export_windowed_programs(
        WindowedExportRequest(
            model=request.model,
            out_dir=request.out_dir,
            ramp=tuple(_default(request.ramp, hardware_class, "ramp")),
            context_frames=_default(request.context_frames, hardware_class, "context_frames"),
            backend=hardware_class.backend,
            partitioner=_default(request.partitioner, hardware_class, "partitioner"),
            dtype=hardware_class.dtype,
            check=request.check,
        ),
        progress=request.progress,
    )
    artifacts = {
        entry.window.name: PlanArtifact(
            role=entry.window.name,
            file=entry.path,
            sha256=entry.sha256,
            size_bytes=entry.size_bytes,
            contract=window_contract(entry.window, manifest.num_quantizers, manifest.samples_per_frame),
            verification=entry.check,
        )
        for entry in manifest.programs
    }
    plan = ExecPlan(
        hardware_class=hardware_class.name,
        graph_kind="windowed",
        backend=manifest.backend,
        dtype=manifest.dtype,
        model={"id": manifest.model_id, "checkpoint_sha256": manifest.checkpoint_sha256, "geometry": manifest.geometry},
        sample_rate=manifest.sample_rate,
        samples_per_frame=manifest.samples_per_frame,
        num_quantizers=manifest.num_quantizers,
        codebook_size=manifest.codebook_size,
        artifacts=artifacts,
        windowed={
            "ramp": list(manifest.ramp),
            "context_frames": manifest.context_frames,
            "partitioner": manifest.partitioner,
        },
        device_dir=request.device_dir,
        build={"tools": manifest.tools, "manifest": "manifest.json"},
        directory=Path(request.out_dir),
    )
    return _write_and_load(plan, request)


# -- stateful steps (CPU classes, and the ONNX sources of rockchip_npu) ------------------------------


def step_sizes(hardware_class: HardwareClass, request: BuildRequest) -> dict[str, int]:
    main = _default(request.step_frames, hardware_class, "step_frames")
    first = _default(request.first_step_frames, hardware_class, "first_step_frames") or 0
    if main < 1 or first < 0:
        raise EdgeExportError(
            f"step sizes must be >= 1 frame (first step: 0 for none), found main {main}, first {first}"
        )
    return {"main": main} | ({"first": first} if first else {})


def export_steps(
    hardware_class: HardwareClass, request: BuildRequest
) -> tuple[dict[str, tuple[Path, Any, float | None]], dict[str, Any]]:
    """Export (or keep) the ONNX step graphs of ``request``; returns ``{role: (path, contract, snr)}`` and the model.

    A kept graph (same checkpoint, same step size, same sha256 as recorded) is checked again in
    onnxruntime against the full decode when ``request.check`` is set.
    """
    from ..backends.onnx import check_step_graph, export_step_onnx, graph_contract

    sizes = step_sizes(hardware_class, request)
    files = resolve_speech_tokenizer(request.model)
    fingerprint = {"checkpoint_sha256": checkpoint_sha256(files)}
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path = out_dir / STATE_NAME
    state = _read_state(state_path)
    done = state.get("steps", {}) if state.get("fingerprint") == fingerprint else {}

    @cache
    def decoder():
        from ..decoder_export import load_code2wav_decoder

        return load_code2wav_decoder(files.directory)

    graphs: dict[str, tuple[Path, Any, float | None]] = {}
    for index, (role, frames) in enumerate(sizes.items(), start=1):
        label = f"[{index}/{len(sizes)}] {role} step B={frames}"
        path = out_dir / f"step_b{frames}.onnx"
        kept = _intact(path, done.get(path.name))
        if kept:
            request.progress(f"{label}: kept {path.name} ({path.stat().st_size / 1e6:.1f} MB, intact)")
        else:
            request.progress(f"{label}: exporting {path.name}")
            export_step_onnx(decoder(), frames, path, check=False)
        snr = None
        if request.check:  # kept graphs too: verification, not hope
            try:
                snr = check_step_graph(decoder(), path)
            except EdgeExportError:
                path.unlink(missing_ok=True)
                raise
        if not kept:
            done[path.name] = {"sha256": file_sha256(path), "size_bytes": path.stat().st_size}
            write_json_atomically(state_path, {"fingerprint": fingerprint, "steps": done})
        contract = graph_contract(path)
        verdict = f"onnxruntime stepwise vs full decode {snr:.1f} dB" if snr is not None else "not checked"
        request.progress(f"{label}: {path.name} N={contract.cache_numel}: {verdict}")
        graphs[role] = (path, contract, snr)
    model = {"id": str(request.model), "checkpoint_sha256": fingerprint["checkpoint_sha256"]}
    return graphs, model


def build_onnx_steps(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    from ..windowed_export import tool_versions

    graphs, model = export_steps(hardware_class, request)
    steps = {
        role: StepArtifact(
            path=path,
            contract=contract,
            verification=None if snr is None else {"runtime": "onnxruntime", "against": "full decode", "snr_db": snr},
        )
        for role, (path, contract, snr) in graphs.items()
    }
    plan = stateful_plan(
        hardware_class=hardware_class.name,
        backend=hardware_class.backend,
        dtype=hardware_class.dtype,
        model=model,
        directory=request.out_dir,
        steps=steps,
        device_dir=request.device_dir,
        build={"tools": tool_versions("onnx", "onnxruntime", "torch")},
    )
    return _write_and_load(plan, request)


# -- rockchip_npu ---------------------------------------------------------------------------------------


def converter_python() -> str:
    """The interpreter that has rknn-toolkit2: $VLLM_OMNI_EDGE_RKNN_PYTHON, this one, or the repo's .venv-rknn."""
    configured = os.environ.get(CONVERTER_PYTHON_ENV)
    if configured:
        if not Path(configured).is_file():
            raise EdgeError(
                f"{CONVERTER_PYTHON_ENV}={configured} does not exist; point it at the converter venv's python"
            )
        return configured
    if importlib.util.find_spec("rknn") is not None:
        return sys.executable
    venv = REPO_ROOT / ".venv-rknn" / "bin" / "python"
    if venv.is_file():
        return str(venv)
    raise EdgeError(
        "rockchip_npu needs rknn-toolkit2, which lives in its own venv: run `make setup-rknn` (it makes "
        f".venv-rknn), or set {CONVERTER_PYTHON_ENV} to a python that has it"
    )


def build_rknn(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    target = request.target or hardware_class.default_target
    if target not in hardware_class.targets:
        raise EdgeExportError(
            f"unknown target {target!r} for {hardware_class.name}; known: {', '.join(hardware_class.targets)}"
        )
    python = converter_python()  # before any export work
    if not RKNN_SCRIPT.is_file():
        raise EdgeError(f"{RKNN_SCRIPT} is missing: building for {hardware_class.name} needs a source checkout")
    graphs, _ = export_steps(hardware_class, request)
    kept = _kept_rknn_plan(request, target, {role: path for role, (path, _, _) in graphs.items()})
    if kept is not None:
        request.progress(f"kept the {target} .rknn steps of plan {kept.plan_id[:12]}: built from the same ONNX graphs")
        return kept
    main = graphs["main"][0]
    command = [python, str(RKNN_SCRIPT), "--model-dir", str(request.model), "--onnx", str(main)]
    if "first" in graphs:
        command += ["--first-onnx", str(graphs["first"][0])]
    command += ["--target", target, "--output", str(main.with_suffix(".rknn")), "--device-dir", request.device_dir]
    request.progress(f"compiling for {target} in the converter venv ({python}); this takes minutes per step size")
    result = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if result.returncode != 0:
        what = {4: "the simulator check missed its bar", 2: "the converter refused its arguments"}
        raise EdgeExportError(
            f"the RKNN conversion failed ({what.get(result.returncode, f'exit code {result.returncode}')}); its "
            f"report and build logs are beside {main.with_suffix('.rknn')}"
        )
    plan = ExecPlan.load(request.out_dir)
    request.progress(f"plan {plan.plan_id[:12]} validated ({len(plan.artifacts)} artifacts)")
    return plan


def _kept_rknn_plan(request: BuildRequest, target: str, sources: dict[str, Path]) -> ExecPlan | None:
    try:
        plan = ExecPlan.load(request.out_dir)
    except ExecPlanError:
        return None
    if plan.backend != "rknn" or plan.target != target or set(plan.artifacts) != set(sources):
        return None
    # load() checked each recorded source against its sha256 in this directory: same name, same graph.
    for role, path in sources.items():
        source = plan.artifacts[role].source
        if source is None or source["file"] != path.name:
            return None
    return plan


# -- shared -------------------------------------------------------------------------------------------


def _write_and_load(plan: ExecPlan, request: BuildRequest) -> ExecPlan:
    path = plan.write(request.out_dir)
    loaded = ExecPlan.load(path, check_sha256=False)  # sha256s were computed from these files in this build
    request.progress(f"wrote {path}: plan {loaded.plan_id[:12]}, {len(loaded.artifacts)} artifacts, validated")
    return loaded


def _intact(path: Path, record: dict[str, Any] | None) -> bool:
    return record is not None and file_matches(path, record.get("size_bytes"), record.get("sha256"))


def _read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """Build every artifact of ``hardware_class`` and return its validated plan."""
    return hardware_class.load_builder()(hardware_class, request)
