"""The stateful step for phones: one ExecuTorch program with a method per step size, checked in its runtime.

``npu_phone --graph stateful`` exports the step in its ``xnnpack_whole`` layout (:mod:`...graphs.layouts`: the
ops XNNPACK delegates) at each step size
(first B=2, main B=16 by default) through ``torch.export`` and lowers them *together* into one
``steps.pte`` (methods ``step_b2``, ``step_b16``), so the weights are stored once. Each method
carries its step contract as a constant method (``step_b16__step_contract()``), and the plan
names the same file for both roles with the method of each. Before the plan is written, the
program runs in the ExecuTorch runtime through the device's :class:`StatefulDecoder` over a
stream longer than the sliding window (main alone, then first + main) against the full decode.
Each method's delegation report (operators outside the delegate by kind, their share of the FLOPs
and, profiled in the runtime, of the step's time) goes into the build output and ``build.delegation``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

from ...backends.executorch.delegation import DelegationReport
from ...backends.executorch.export import ExecuTorchProgramWriter
from ...backends.executorch.program import STEP_CONTRACT_KEY
from ...backends.executorch.run import ExecuTorchStepRunner, load_program, profile_outside_time, step_contract_of
from ...backends.torch_export.export import quiet_torch_export
from ...checkpoint import checkpoint_sha256, load_code2wav_decoder, model_label, resolve_speech_tokenizer
from ...errors import EdgeExportError
from ...files import file_sha256, remove_partial_files
from ...graphs.layouts import PHONE_LAYOUT, get_layout
from ...hardware.registry import HardwareClass
from ...plan.construct import StepArtifact, stateful_plan
from ...plan.model import ExecPlan
from ..request import BuildRequest, class_default
from ..state import STATE_NAME, BuildState, tool_versions
from ..steps import check_frames_for, check_step_runners, step_sizes

PROGRAM_NAME = "steps.pte"


def step_method(step_frames: int) -> str:
    """The method of the step of ``step_frames`` frames in a step program."""
    return f"step_b{step_frames}"


def write_step_program(
    decoder: Qwen3TTSTokenizerV2Decoder, step_sizes: list[int], path: Path, writer: ExecuTorchProgramWriter
) -> dict[str, dict[str, int]]:
    """Export the step of each size and lower them into one program at ``path``; op counts per method."""
    methods: dict[str, tuple[Any, dict[str, Any]]] = {}
    for frames in sorted(set(step_sizes)):
        step = get_layout(PHONE_LAYOUT).make_step(decoder, frames).eval()
        with torch.no_grad(), quiet_torch_export():
            exported = torch.export.export(step, step.example_inputs())
        methods[step_method(frames)] = (exported, {STEP_CONTRACT_KEY: json.dumps(step.contract.to_json())})
    try:
        with quiet_torch_export():
            return writer.write_methods(methods, path)
    except EdgeExportError:
        raise
    except Exception as exc:  # the toolchain raises many types; name the stage
        raise EdgeExportError(
            f"lowering the steps {sorted(methods)} to ExecuTorch ({writer.partitioner}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def profile_delegation(path: Path, ops: dict[str, dict[str, Any]], sizes: dict[str, int]) -> dict[str, dict]:
    """Each step method's delegation report with the time of its outside operators, profiled in the runtime."""
    import torch

    program, reports = load_program(path), {}  # read for the contracts only: no step method is loaded
    for frames in sorted(set(sizes.values())):
        method = step_method(frames)
        report = DelegationReport.from_json(ops[method]["delegation"])
        shapes = step_contract_of(program, method, str(path)).input_shapes()
        inputs = [torch.zeros(shapes["audio_codes"], dtype=torch.int64)]
        inputs += [torch.zeros(shapes[name]) for name in ("freqs_in", "cache_valid", "cache_in")]
        report = report.with_profile(*profile_outside_time(path, method, inputs))
        reports[method] = report.to_json()
    return reports


def open_step_runners(path: Path, sizes: dict[str, int]) -> dict[str, ExecuTorchStepRunner]:
    """A runner per role over one loaded program (its methods share the weights in memory too)."""
    program = load_program(path)
    return {role: ExecuTorchStepRunner(path, step_method(frames), program) for role, frames in sizes.items()}


def check_step_program(
    decoder: Qwen3TTSTokenizerV2Decoder, runners: dict[str, ExecuTorchStepRunner]
) -> dict[str, dict[str, Any]]:
    """Each role's verification: the main step alone, and the first step followed by main steps."""
    main = runners["main"]
    frames = check_frames_for(main.contract) + 1  # + 1: the stream ends on a padded flush
    checks = {"main": (frames, check_step_runners(decoder, main, frames=frames, label=f"{main.path}:step main"))}
    if "first" in runners:
        frames += runners["first"].contract.step_frames
        match = check_step_runners(decoder, main, runners["first"], frames=frames, label=f"{main.path}:first + main")
        checks["first"] = (frames, match)
    return {
        role: {
            "runtime": "executorch",
            "against": "full decode",
            "schedule": "first + main steps, padded flush" if role == "first" else "main steps, padded flush",
            "frames": frames,
            **match.to_json(),
        }
        for role, (frames, match) in checks.items()
    }


def build(hardware_class: HardwareClass, request: BuildRequest) -> ExecPlan:
    """Build (or keep) ``steps.pte``, check it in the ExecuTorch runtime, and write the stateful plan."""
    from ..plans import write_and_load

    sizes = step_sizes(hardware_class, request)
    if sizes.get("first") == sizes["main"]:  # a first step of the main size is the main step
        del sizes["first"]
    partitioner = class_default(request.partitioner, hardware_class, "partitioner") or "xnnpack"
    writer = ExecuTorchProgramWriter(partitioner)  # refuses a partitioner this host lacks, before any work
    files = resolve_speech_tokenizer(request.model)
    fingerprint = {
        "checkpoint_sha256": checkpoint_sha256(files),
        "partitioner": partitioner,
        "steps": dict(sorted(sizes.items())),
        "graph_layout": PHONE_LAYOUT,
        "max_stage_bytes": writer.max_stage_bytes,
    }
    out_dir = Path(request.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_partial_files(out_dir)
    state = BuildState(out_dir / STATE_NAME, fingerprint, "programs")

    @cache
    def decoder() -> Qwen3TTSTokenizerV2Decoder:
        return load_code2wav_decoder(files.directory)

    path = out_dir / PROGRAM_NAME
    label = f"steps {', '.join(f'{role} B={frames}' for role, frames in sizes.items())}"
    record = state.intact(path.name, lambda _record: path)
    if record is not None:
        request.progress(f"{label}: kept {path.name} ({path.stat().st_size / 1e6:.1f} MB, intact)")
        ops, delegation = record.get("ops"), record.get("delegation")
    else:
        request.progress(f"{label}: exporting and lowering into one program {path.name} ({partitioner})")
        ops = write_step_program(decoder(), list(sizes.values()), path, writer)
        request.progress(f"{label}: wrote {path.name} ({path.stat().st_size / 1e6:.1f} MB); profiling its methods")
        delegation = profile_delegation(path, ops, sizes) if partitioner != "none" else None
    for report in (delegation or {}).values():
        request.progress(report["summary"])
    runners = open_step_runners(path, sizes)
    checks: dict[str, dict[str, Any]] = {}
    if request.check:  # kept programs too: verification, not hope
        try:
            checks = check_step_program(decoder(), runners)
        except EdgeExportError:
            path.unlink(missing_ok=True)
            raise
        for role, check in checks.items():
            request.progress(
                f"{role} {step_method(sizes[role])}: ExecuTorch stepwise ({check['schedule']}, {check['frames']} "
                f"frames) vs full decode: SNR {check['snr_db']:.1f} dB, max abs {check['max_abs_diff']:.3g}"
            )
    if record is None:
        state.record(
            path.name,
            {"sha256": file_sha256(path), "size_bytes": path.stat().st_size, "ops": ops, "delegation": delegation},
        )
    steps = {
        role: StepArtifact(
            path=path, contract=runner.contract, verification=checks.get(role), method=runner.method_name
        )
        for role, runner in runners.items()
    }
    plan = stateful_plan(
        hardware_class=hardware_class.name,
        backend=hardware_class.backend,
        dtype=hardware_class.dtype,
        model={"id": model_label(request.model), "checkpoint_sha256": fingerprint["checkpoint_sha256"]},
        directory=out_dir,
        steps=steps,
        device_dir=request.device_dir,
        build={
            "tools": tool_versions("torch", "executorch"),
            "partitioner": partitioner,
            "graph_layout": PHONE_LAYOUT,
            "ops": ops,
            **({"delegation": delegation} if delegation else {}),
        },
    )
    return write_and_load(plan, request)
