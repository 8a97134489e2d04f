"""`build --hardware npu_phone --graph stateful`: one ExecuTorch program with a method per step size, exact."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.backends.executorch.delegation import DelegationReport
from vllm_omni.edge.backends.executorch.export import ExecuTorchProgramWriter
from vllm_omni.edge.backends.executorch.program import STEP_CONTRACT_KEY, metadata_method
from vllm_omni.edge.backends.executorch.run import load_program, step_contract_of
from vllm_omni.edge.builders.executorch.build import (
    PROGRAM_NAME,
    check_step_program,
    open_step_runners,
    write_step_program,
)
from vllm_omni.edge.cli.main import main as edge_main
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.edge.plan.validation import check_contracts
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.edge.runtime.open import open_decoder
from vllm_omni.testing.codes import random_codes

EXACT_DB = 110.0


def full_decode(small_decoder, frames: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()


def test_the_stateful_phone_plan_names_two_methods_of_one_program(phone_steps_plan):
    plan = ExecPlan.load(phone_steps_plan)
    assert (plan.hardware_class, plan.graph_kind, plan.backend) == ("npu_phone", "stateful", "executorch")
    assert {role: (a.file, a.method) for role, a in plan.artifacts.items()} == {
        "main": (PROGRAM_NAME, "step_b4"),
        "first": (PROGRAM_NAME, "step_b2"),
    }
    assert sorted(path.name for path in phone_steps_plan.glob("*.pte")) == [PROGRAM_NAME]
    for role in ("main", "first"):
        check = plan.artifacts[role].verification
        assert check["runtime"] == "executorch" and check["snr_db"] >= EXACT_DB
        # longer than the KV history twice over: the sliding window and the conv tails were exercised
        assert check["frames"] > 2 * plan.step_contract(role).kv_slots


def test_each_step_method_runs_whole_in_one_xnnpack_call_and_reports_it(phone_steps_plan):
    plan = ExecPlan.load(phone_steps_plan)
    assert plan.build["graph_layout"] == "xnnpack_whole"
    for method in ("step_b2", "step_b4"):
        report = DelegationReport.from_json(plan.build["delegation"][method])
        assert report.delegate == "xnnpack" and report.delegate_calls == 1
        # left outside: only data movement of the int64 codes and the final join of the cache
        assert {ops.kind for ops in report.outside} <= {"select_copy", "embedding", "cat"}
        assert report.outside_flops == 0 and report.delegated_flops_share == 1.0
        assert report.step_seconds > 0 and 0 <= report.outside_time_share < 1  # profiled in the runtime
        assert f"delegation {report.summary()}" in plan.summary()


def test_a_program_cut_into_small_stages_streams_the_full_decode(small_decoder, tmp_path):
    """64 KiB of weights per XNNPACK delegate (the small checkpoint holds 5.7 MB): many stages, each packed
    on its own at load, the two methods loaded with the weight cache on (packed weights shared), still exact."""
    path = tmp_path / PROGRAM_NAME
    ops = write_step_program(small_decoder, [2, 4], path, ExecuTorchProgramWriter("xnnpack", max_stage_bytes=2**16))
    for method in ("step_b2", "step_b4"):
        report = DelegationReport.from_json(ops[method]["delegation"])
        assert report.delegate_calls > 10 and report.delegated_flops_share == 1.0
    checks = check_step_program(small_decoder, open_step_runners(path, {"main": 4, "first": 2}))
    assert all(check["snr_db"] >= EXACT_DB for check in checks.values()), checks


def test_the_program_carries_each_step_contract_as_a_constant_method(phone_steps_plan):
    plan = ExecPlan.load(phone_steps_plan)
    program = load_program(phone_steps_plan / PROGRAM_NAME)
    assert {metadata_method(m, STEP_CONTRACT_KEY) for m in ("step_b2", "step_b4")} < program.method_names
    for role in ("main", "first"):
        assert step_contract_of(program, plan.artifacts[role].method, "steps.pte") == plan.step_contract(role)


def test_a_mixed_schedule_in_the_executorch_runtime_equals_the_full_decode(phone_steps_plan, small_decoder):
    decoder = open_decoder(phone_steps_plan)
    assert isinstance(decoder, StatefulDecoder)
    # Utterance 1: 1 frame (no step yet), then the first step (2), main steps (4), a padded flush.
    frames = random_codes(31, 16, 2048, seed=21)[0].T.numpy().copy()
    pieces = [decoder.feed(frames[:1])]
    assert pieces[0].size == 0 and decoder.position == 0
    pieces += [decoder.feed(frames[1:3]), decoder.feed(frames[3:20]), decoder.feed(frames[20:])]
    assert decoder.position == 30 and decoder.pending_frames == 1
    pieces.append(decoder.flush())
    assert snr_db(full_decode(small_decoder, frames), np.concatenate(pieces)) >= EXACT_DB
    # An abandoned stream, reset, then utterance 2 from scratch.
    decoder.feed(random_codes(9, 16, 2048, seed=22)[0].T.numpy().copy())
    decoder.reset()
    second = random_codes(26, 16, 2048, seed=23)[0].T.numpy().copy()
    audio = np.concatenate([decoder.feed(second[:7]), decoder.feed(second[7:]), decoder.flush()])
    assert snr_db(full_decode(small_decoder, second), audio) >= EXACT_DB


def test_a_tampered_program_is_refused(phone_steps_plan, tmp_path):
    copy = Path(shutil.copytree(phone_steps_plan, tmp_path / "plan"))
    program = copy / PROGRAM_NAME
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    with pytest.raises(ExecPlanError, match=r"artifacts\.main\.sha256"):
        open_decoder(copy)


def test_a_plan_whose_roles_swap_methods_is_refused_by_the_program_contract(phone_steps_plan):
    plan = ExecPlan.load(phone_steps_plan)
    swapped = {
        "main": dataclasses.replace(plan.artifacts["main"], method="step_b2"),
        "first": dataclasses.replace(plan.artifacts["first"], method="step_b4"),
    }
    with pytest.raises(ExecPlanError, match=r"artifacts\.(main|first): method step_b\d of steps\.pte describes itself"):
        open_decoder(dataclasses.replace(plan, artifacts=swapped))


def test_rows_naming_one_file_must_agree_and_name_their_own_methods(phone_steps_plan):
    plan = ExecPlan.load(phone_steps_plan)
    main, first = plan.artifacts["main"], plan.artifacts["first"]
    same_method = dataclasses.replace(
        plan, artifacts={"main": main, "first": dataclasses.replace(first, method="step_b4")}
    )
    with pytest.raises(ExecPlanError, match=r"both name method step_b4 of steps\.pte"):
        check_contracts(same_method)
    other_size = dataclasses.replace(first, size_bytes=first.size_bytes + 1)
    with pytest.raises(ExecPlanError, match=r"artifacts\.first: names steps\.pte like artifacts\.main"):
        check_contracts(dataclasses.replace(plan, artifacts={"main": main, "first": other_size}))


def test_a_graph_the_class_does_not_build_and_a_missing_partitioner_are_refused(small_checkpoint, tmp_path, capsys):
    command = ["build", "--hardware", "cpu_x86_64", "--graph", "windowed", "--model", str(small_checkpoint)]
    assert edge_main([*command, "--out", str(tmp_path / "cpu")]) == 2
    assert "--graph windowed: cpu_x86_64 builds stateful graphs" in capsys.readouterr().err
    command = ["build", "--hardware", "npu_phone", "--graph", "stateful", "--partitioner", "coreml"]
    assert edge_main([*command, "--model", str(small_checkpoint), "--out", str(tmp_path / "phone")]) == 1
    assert "error: --partitioner coreml needs coremltools" in capsys.readouterr().err
    assert not (tmp_path / "phone" / PROGRAM_NAME).exists()
