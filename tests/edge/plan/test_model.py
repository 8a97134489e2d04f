"""Execution plans: validation names the artifact and field; a plan's decoder matches the full decode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.cli.main import main as edge_main
from vllm_omni.edge.plan import PLAN_NAME, ExecPlan, ExecPlanError, session_option
from vllm_omni.edge.plan.model import _plan_digest
from vllm_omni.edge.runtime.open import open_decoder
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.reference import full_decode


@pytest.fixture
def plan_copy(cpu_plan, tmp_path) -> Path:
    return Path(shutil.copytree(cpu_plan, tmp_path / "plan"))


def edit_plan(directory: Path, change, rehash: bool = True) -> None:
    """Change the plan JSON; by default keep its plan_id right so the check under test is the one that fires."""
    path = directory / PLAN_NAME
    payload = json.loads(path.read_text())
    change(payload)
    if rehash:
        payload["plan_id"] = _plan_digest({k: v for k, v in payload.items() if k != "plan_id"})
    path.write_text(json.dumps(payload))


def load_error(directory: Path) -> str:
    with pytest.raises(ExecPlanError) as caught:
        ExecPlan.load(directory)
    return str(caught.value)


def test_the_cpu_plan_validates_and_names_its_steps(cpu_plan):
    plan = ExecPlan.load(cpu_plan)
    assert (plan.hardware_class, plan.graph_kind, plan.backend, plan.dtype) == (
        "cpu_x86_64",
        "stateful",
        "onnxruntime",
        "fp32",
    )
    assert set(plan.artifacts) == {"main", "first"}
    assert plan.step_contract("main").step_frames == 4 and plan.step_contract("first").step_frames == 2
    assert plan.artifacts["main"].verification["snr_db"] > 90
    # one dynamic graph serves both roles: one copy of the weights on disk and in memory
    assert plan.speech_decoder == {
        "impl": "onnxruntime",
        "artifacts": {"main": "/data/qwen3-tts/step_b1-4.onnx", "first": "/data/qwen3-tts/step_b1-4.onnx"},
    }
    assert plan.step_contract("main").max_step_frames == 4
    assert session_option(plan).startswith('qwen3_tts.exec_plan={"speech_decoder":{"impl":"onnxruntime"')
    assert len(plan.model["checkpoint_sha256"]) == 64 and plan.model["geometry"]["num_quantizers"] == 16


def test_a_plan_of_one_file_per_role_writes_no_method_and_keeps_its_id(cpu_plan):
    payload = json.loads((cpu_plan / PLAN_NAME).read_text())
    assert all("method" not in row for row in payload["artifacts"].values())
    assert (
        ExecPlan.load(cpu_plan).plan_id
        == payload["plan_id"]
        == _plan_digest({k: v for k, v in payload.items() if k != "plan_id"})
    )


def test_decoding_through_the_cpu_plan_equals_the_full_decode(cpu_plan, small_decoder):
    frames = random_codes(23, 16, 2048, seed=5)[0].T.numpy().copy()
    decoder = open_decoder(cpu_plan)
    pieces = [decoder.feed(frames[:3]), decoder.feed(frames[3:11]), decoder.feed(frames[11:]), decoder.flush()]
    assert snr_db(full_decode(small_decoder, frames), np.concatenate(pieces)) >= 90


GRAPH = "step_b1-4.onnx"  # the one dynamic graph both roles of the small CPU plan run


def test_a_tampered_artifact_fails_naming_it_and_the_field(plan_copy):
    ExecPlan.load(plan_copy)  # verified once: remembered by identity from here on
    data = bytearray((plan_copy / GRAPH).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (plan_copy / GRAPH).write_bytes(bytes(data))
    message = load_error(plan_copy)
    assert "artifacts.main.sha256" in message and GRAPH in message and "rebuild" in message
    with pytest.raises(ExecPlanError, match="artifacts.main.sha256"):
        open_decoder(plan_copy)  # a runtime never sees the file


def test_a_missing_or_truncated_file_fails_naming_it(plan_copy):
    data = (plan_copy / GRAPH).read_bytes()
    (plan_copy / GRAPH).unlink()
    assert f"artifacts.main.file: {GRAPH} is missing" in load_error(plan_copy)
    (plan_copy / GRAPH).write_bytes(data[:-10])
    assert "artifacts.main.size_bytes: the plan says" in load_error(plan_copy)


def test_roles_sharing_a_file_must_agree_on_it(plan_copy):
    edit_plan(plan_copy, lambda p: p["artifacts"]["first"].update(sha256="0" * 64))
    assert f"artifacts.first: names {GRAPH} like artifacts.main, but with sha256" in load_error(plan_copy)


def test_the_files_of_a_plan_are_each_listed_once_with_the_field_that_records_them(plan_copy):
    """What a device downloads and the server lists: a file two roles share once, a recorded source graph too,
    and a file in a subfolder of the plan's directory by its relative path."""
    (plan_copy / "graphs").mkdir()
    shutil.copy(plan_copy / GRAPH, plan_copy / "graphs" / "source.onnx")
    graph = json.loads((plan_copy / PLAN_NAME).read_text())["artifacts"]["main"]
    source = {"file": "graphs/source.onnx", "sha256": graph["sha256"], "size_bytes": graph["size_bytes"]}
    edit_plan(plan_copy, lambda p: p["artifacts"]["first"].update(source=source))
    files = ExecPlan.load(plan_copy).files()
    assert [(name, record.field) for name, record in files.items()] == [
        (GRAPH, "artifacts.main"),
        ("graphs/source.onnx", "artifacts.first.source"),
    ]
    assert files["graphs/source.onnx"].size_bytes == graph["size_bytes"] == (plan_copy / GRAPH).stat().st_size
    (plan_copy / "graphs" / "source.onnx").write_bytes(b"\0" * graph["size_bytes"])
    assert "artifacts.first.source.sha256: the plan says" in load_error(plan_copy)


def test_an_unknown_schema_version_or_schema_is_refused(plan_copy):
    edit_plan(plan_copy, lambda p: p.update(schema_version=3))
    assert "schema_version: 3 is not one this reader knows (2)" in load_error(plan_copy)
    edit_plan(plan_copy, lambda p: p.update(schema="someone-else/plan", schema_version=2))
    assert "schema: expected 'vllm-omni-edge/exec-plan'" in load_error(plan_copy)


def test_schema_violations_name_the_field(plan_copy):
    edit_plan(plan_copy, lambda p: p["artifacts"]["main"].update(size_bytes="big"))
    assert "artifacts.main.size_bytes: 'big' is not of type 'integer'" in load_error(plan_copy)


def test_inconsistent_contracts_fail_naming_the_field(plan_copy):
    def other_cache(payload):
        payload["artifacts"]["first"]["contract"]["cache_numel"] += 8
        payload["artifacts"]["first"]["contract"]["outputs"]["cache_out"] = [7816]
        payload["artifacts"]["first"]["contract"]["inputs"]["cache_in"] = [7816]

    edit_plan(plan_copy, other_cache)
    message = load_error(plan_copy)
    assert "artifacts.first.contract" in message and "cache_numel" in message


def test_contract_shapes_must_follow_from_the_step_size(plan_copy):
    edit_plan(plan_copy, lambda p: p["artifacts"]["main"]["contract"]["inputs"].update(audio_codes=[1, 16, 5]))
    assert "artifacts.main.contract.inputs" in load_error(plan_copy)


def test_contracts_must_match_the_geometry(plan_copy):
    edit_plan(plan_copy, lambda p: p.update(num_quantizers=8))
    assert "artifacts.main.contract: num_quantizers is 16, the plan's geometry says 8" in load_error(plan_copy)


def test_a_hand_edited_plan_fails_its_id(plan_copy):
    edit_plan(plan_copy, lambda p: p.update(device_dir="/elsewhere"), rehash=False)
    assert "plan_id" in load_error(plan_copy)


def test_plan_validate_and_show_on_the_command_line(cpu_plan, plan_copy, capsys):
    assert edge_main(["plan", "validate", str(cpu_plan)]) == 0
    assert "valid: plan" in capsys.readouterr().out
    assert edge_main(["plan", "show", str(cpu_plan)]) == 0
    shown = capsys.readouterr().out
    assert "hardware class cpu_x86_64" in shown and GRAPH in shown and "B=4 N=7808" in shown
    (plan_copy / GRAPH).write_bytes(b"not a graph")
    assert edge_main(["plan", "validate", str(plan_copy)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "artifacts.main.size_bytes" in errors[0]


def test_a_hand_edited_op_placement_shows_as_unknown_in_the_summary(plan_copy):
    """``build`` is a free-form record outside the plan id: odd placement fields show as ``?``, never raise."""
    odd = {
        "ghost": "odd",
        "main": {"npu_ops": [5, "x"], "cpu_ops": {"Gather": 3, "Sin": {"count": 2}}, "no_lowering": [{"op": "E"}, 7]},
        "first": None,  # shares main's file: main's line stands for both
    }
    edit_plan(plan_copy, lambda p: p["build"].update(placement=odd, cpu_ops_allowed="yes"))
    lines = [line for line in ExecPlan.load(plan_copy).summary().splitlines() if line.startswith("  placement ")]
    assert lines == [
        "  placement ghost: not read",
        f"  placement {GRAPH}: ? ops on the NPU; on the CPU: Gather, Sin x2; without a lowering: E x1, ? x1",
    ]
    edit_plan(plan_copy, lambda p: p["build"].update(placement={"main": {}}, cpu_ops_allowed=False))
    lines = [line for line in ExecPlan.load(plan_copy).summary().splitlines() if line.startswith("  placement ")]
    assert lines == [f"  placement {GRAPH}: ? ops on the NPU; on the CPU (expected): ?; without a lowering: ?"]
    edit_plan(plan_copy, lambda p: p["build"].update(placement=["main"]))
    assert "placement" not in ExecPlan.load(plan_copy).summary()


def test_a_hand_edited_delegation_report_shows_as_not_read_in_the_summary(plan_copy):
    edit_plan(plan_copy, lambda p: p["build"].update(delegation={"step_b4": {"flops": 1}, "step_b2": 7}))
    lines = [line for line in ExecPlan.load(plan_copy).summary().splitlines() if line.startswith("  delegation ")]
    assert lines == ["  delegation step_b4: not read", "  delegation step_b2: not read"]


def test_a_rebuild_keeps_intact_graphs_and_redoes_a_damaged_one(
    small_checkpoint, plan_copy, capsys, edge_args, build_plan
):
    before = ExecPlan.load(plan_copy)
    build_plan(small_checkpoint, plan_copy, "cpu_x86_64", *edge_args["step"])
    assert f"kept {GRAPH}" in capsys.readouterr().err
    assert ExecPlan.load(plan_copy).artifacts["main"].sha256 == before.artifacts["main"].sha256
    (plan_copy / GRAPH).write_bytes(b"damaged")
    build_plan(small_checkpoint, plan_copy, "cpu_x86_64", *edge_args["step"])
    assert f"exporting {GRAPH}" in capsys.readouterr().err
    after = ExecPlan.load(plan_copy)
    assert after.artifacts["main"].sha256 == before.artifacts["main"].sha256  # the export is deterministic


def test_a_malformed_step_contract_is_an_error_naming_it(plan_copy):
    edit_plan(plan_copy, lambda p: p["artifacts"]["main"]["contract"].update(cache_layout=[["x"]], head_dim="big"))
    assert "artifacts.main.contract" in load_error(plan_copy)
