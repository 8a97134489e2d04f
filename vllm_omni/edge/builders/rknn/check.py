"""The converter's simulator check and accuracy analysis.

The simulator check streams ``--check-steps`` (default 20) steps from a zero cache through one
shared cache, mixing the ``first`` graph (when there is one: the first step and every fifth) with
``main``, and compares with onnxruntime on the same graphs and, when the checkpoint is at hand,
with the full decode, step by step. The fp16 bar is 40 dB SNR against the full decode (against
onnxruntime with ``--onnx`` alone), or a peak error at or below -40 dBFS for a near-silent
checkpoint (:class:`~vllm_omni.edge.audio.ReferenceMatch`). :func:`simulator_check` returns the verdict and keeps
``accuracy_analysis`` beside the output; :func:`~.convert.compile_and_check` raises
:class:`~.errors.SimulatorCheckError` for a miss.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ...audio import match_reference, snr_db
from ...backends.onnx.run import OnnxStepGraph
from ...backends.rknn.convert import BuiltEngine
from ...backends.rknn.errors import RknnBuildError
from ...backends.rknn.run import RknnSimulatorStepRunner
from ...progress import progress_printer
from ...runtime.stateful_decoder import rope_angles

SIMULATOR_BAR_DB = 40.0
FIRST_STEP_EVERY = 5  # the check's schedule: a first-size step at step 0, 5, 10, ... (one shared cache)


def check_schedule(contracts: dict, steps: int) -> list[str]:
    """The roles of the check's steps: ``first`` at step 0 and every :data:`FIRST_STEP_EVERY`-th, else ``main``."""
    if "first" not in contracts:
        return ["main"] * steps
    return ["first" if index % FIRST_STEP_EVERY == 0 else "main" for index in range(steps)]


def stream_steps(runners: dict, contracts: dict, codes: np.ndarray, schedule: list[str]) -> np.ndarray:
    """Run ``schedule`` over ``codes`` ([frames, Q]) from a zero cache, one cache shared by all roles."""
    main = contracts["main"]
    inv_freq = np.asarray(main.rope_inv_freq, dtype=np.float32)
    cache = np.zeros(main.cache_numel, dtype=np.float32)
    position, pieces = 0, []
    for role in schedule:
        size = contracts[role].step_frames
        block = np.ascontiguousarray(codes[position : position + size].T[None])
        valid = np.array([min(position, main.kv_slots)], dtype=np.float32)
        audio, cache = runners[role].run(block, rope_angles(position, size, inv_freq), valid, cache)
        cache = np.asarray(cache, dtype=np.float32)
        pieces.append(np.asarray(audio, dtype=np.float32).reshape(-1))
        position += size
    return np.concatenate(pieces)


def simulator_check(args, graphs, contracts, engines, decoder) -> dict:
    """Stream ``check_steps`` mixed first/main steps through the simulator; compare per step with the references."""
    main = contracts["main"]
    schedule = check_schedule(contracts, args.check_steps)
    boundaries = [contracts[role].step_frames for role in schedule]
    frames = sum(boundaries)
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, main.codebook_size, size=(frames, main.num_quantizers), dtype=np.int64)

    started = time.perf_counter()
    simulated_runners = {
        role: RknnSimulatorStepRunner(graphs[role], contracts[role], args.target, engine=engines[role])
        for role in engines
    }
    simulated = stream_steps(simulated_runners, contracts, codes, schedule)
    sim_seconds = time.perf_counter() - started
    sessions = {path: OnnxStepGraph(path) for path in roles_by_graph(graphs)}  # a shared graph loads once
    reference_ort = stream_steps(
        {role: sessions[path].runner(contracts[role].step_frames) for role, path in graphs.items()},
        contracts,
        codes,
        schedule,
    )
    reference, against = reference_ort, "onnxruntime"
    result = {"frames": frames, "steps": boundaries, "simulator_seconds": round(sim_seconds, 2)}
    result["snr_db_vs_onnxruntime"] = snr_db(reference_ort, simulated)
    if decoder is not None:
        import torch

        with torch.inference_mode():
            reference = decoder(torch.from_numpy(codes.T[None].copy()))[0, 0].numpy()
        against = "full decode"
        result["snr_db_vs_full_decode"] = snr_db(reference, simulated)
        result["onnxruntime_snr_db_vs_full_decode"] = snr_db(reference, reference_ort)
    per_step, start = [], 0
    for size in boundaries:
        span = slice(start * main.samples_per_frame, (start + size) * main.samples_per_frame)
        per_step.append(round(snr_db(reference[span], simulated[span]), 1))
        start += size
    result["per_step_snr_db"] = per_step
    result["min_step_snr_db"] = min(per_step)
    result["mean_step_snr_db"] = round(float(np.mean(per_step)), 2)
    result["output_rms"] = float(np.sqrt(np.mean(np.square(reference))))
    overall = match_reference(reference, simulated, SIMULATOR_BAR_DB)
    result["max_abs_diff"] = overall.max_abs
    result["passed"] = overall.passed
    result["verdict"] = (
        f"simulator vs {against}: {overall.describe()} over {len(boundaries)} steps (per step SNR min "
        f"{min(per_step):.1f} / mean {result['mean_step_snr_db']:.1f} dB; output RMS {result['output_rms']:.3g}); "
        f"bar {overall.bar()}: {'passed' if overall.passed else 'MISSED'}"
    )
    say(result["verdict"])
    say(f"per-step SNR dB: {per_step}")
    if not result["passed"]:
        result["accuracy_analysis"] = analyse_accuracy(args, engines[schedule[0]], simulated_runners[schedule[0]])
    return result


def analyse_accuracy(args, engine: BuiltEngine, runner) -> dict:
    """Run ``accuracy_analysis`` on the first step's inputs; name the first layer whose cosine drops."""
    out_dir = args.output.with_name(args.output.stem + ".accuracy")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for index, array in enumerate(runner.step_inputs):
        path = out_dir / f"input_{index}.npy"
        np.save(path, array)
        files.append(str(path))
    try:
        engine.accuracy_analysis(files, out_dir)
    except RknnBuildError as exc:
        return {"dir": str(out_dir), "error": str(exc)}
    first_drift = None
    table = out_dir / "error_analysis.txt"
    if table.is_file():
        for line in table.read_text(errors="replace").splitlines():
            numbers = [float(tok) for tok in line.replace("|", " ").split() if _is_float(tok)]
            if numbers and numbers[0] < 0.999:
                first_drift = line.strip()
                break
    say(f"accuracy_analysis kept in {out_dir}; first layer whose cosine falls below 0.999: {first_drift}")
    return {"dir": str(out_dir), "first_drifting_layer": first_drift}


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def roles_by_graph(graphs: dict[str, Path]) -> dict[Path, list[str]]:
    """The roles of each graph file, ``main`` before ``first`` (the converter compiles each file once)."""
    roles: dict[Path, list[str]] = {}
    for role, path in graphs.items():
        roles.setdefault(path, []).append(role)
    return roles


say = progress_printer("rknn")
