"""Builds under hostile and broken input (issue 12): refused up front with exit 2, nothing foreign replaced."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from vllm_omni.edge.builders import windowed as windowed_build
from vllm_omni.edge.builders.state import BuildState
from vllm_omni.edge.builders.windowed import WindowedExportRequest, export_windowed_programs
from vllm_omni.edge.cli.export import main as export_main
from vllm_omni.edge.cli.main import main as edge_main
from vllm_omni.edge.errors import EdgeExportError
from vllm_omni.edge.files import remove_partial_files

HANG_SECONDS = 60  # refusals come at once; longer is a hang (latencies belong in benchmarks)


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def test_build_out_naming_a_file_is_a_usage_error(small_checkpoint, tmp_path, capsys):
    target = tmp_path / "plan.txt"
    target.write_text("mine")
    code = edge_main(["build", "--hardware", "cpu_x86_64", "--model", str(small_checkpoint), "--out", str(target)])
    assert code == 2 and "is a file" in one_error_line(capsys) and target.read_text() == "mine"


@pytest.mark.parametrize("below", ["sub", "sub/deeper"])
def test_build_and_export_out_under_a_file_are_one_usage_error_line_at_once(small_checkpoint, tmp_path, capsys, below):
    """Issue 26: a path under a file was a NotADirectoryError traceback (after the checkpoint was read)."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    out = str(blocker / below)
    commands = {
        "build": lambda: edge_main(
            ["build", "--hardware", "cpu_x86_64", "--model", str(small_checkpoint), "--out", out]
        ),
        "export": lambda: export_main(
            ["--model", str(small_checkpoint), "--out-dir", out, "--backend", "torch_export"]
        ),
    }
    for name, command in commands.items():
        started = time.perf_counter()
        assert command() == 2, name
        line = one_error_line(capsys)
        assert f"{blocker} is a file, not a directory" in line and out in line, line
        assert time.perf_counter() - started < HANG_SECONDS and blocker.read_text() == "mine"


def test_build_out_in_a_read_only_directory_is_one_usage_error_line(small_checkpoint, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access  # the tests may run as root, whom a chmod does not stop
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    command = ["build", "--hardware", "cpu_x86_64", "--model", str(small_checkpoint), "--out", str(locked / "p")]
    assert edge_main(command) == 2
    assert f"the directory {locked} is not writable" in one_error_line(capsys)
    assert not (locked / "p").exists()


@pytest.mark.parametrize(
    "ramp_args, message",
    [
        (["--ramp", "1", "--context", "100000000"], "context must be an integer >= 0 frames (at most 4096)"),
        (["--ramp", "1", "--context", "4096"], "needs 4097 windows"),
        (["--ramp", "0", "2"], "ramp chunk sizes must be integers >= 1"),
        (["--ramp", "4", "2"], "strictly increasing"),
    ],
)
def test_bad_ramp_values_are_usage_errors_refused_at_once(small_checkpoint, tmp_path, capsys, ramp_args, message):
    started = time.perf_counter()
    command = ["build", "--hardware", "npu_phone", "--model", str(small_checkpoint), "--out", str(tmp_path / "p")]
    assert edge_main([*command, *ramp_args]) == 2
    assert message in one_error_line(capsys)
    assert time.perf_counter() - started < HANG_SECONDS and not (tmp_path / "p").exists()


def test_a_foreign_exec_plan_json_is_not_replaced_without_force(small_checkpoint, tmp_path, capsys):
    out = tmp_path / "p"
    out.mkdir()
    (out / "exec_plan.json").write_text('{"mine": true}')
    command = ["build", "--hardware", "cpu_x86_64", "--model", str(small_checkpoint), "--out", str(out)]
    assert edge_main(command) == 2
    assert "pass --force" in one_error_line(capsys) and (out / "exec_plan.json").read_text() == '{"mine": true}'


@pytest.mark.parametrize(
    "saved",
    [
        "[]",
        '"a string"',
        '{"fingerprint": {"checkpoint_sha256": "c"}, "steps": {"step_b4.onnx": "a string record"}}',
        '{"fingerprint": {"checkpoint_sha256": "c"}, "steps": {"step_b4.onnx": {"size_bytes": 1}}}',
        '{"fingerprint": {"checkpoint_sha256": "c"}, "steps": []}',
        '{"fingerprint": {"checkpoint_sha256": "c"}, "steps": {"x": {"path": "../../etc/passwd"}}}',
        "[" * 100_000,
        b"\xff\xfe not utf-8",
    ],
)
def test_damaged_build_state_is_no_state(tmp_path, saved):
    path = tmp_path / ".build-state.json"
    path.write_bytes(saved if isinstance(saved, bytes) else saved.encode())
    state = BuildState(path, {"checkpoint_sha256": "c"}, "steps")
    for key in ("step_b4.onnx", "x"):
        assert state.intact(key, lambda row: tmp_path / row["path"]) is None
        assert state.intact(key, lambda row: tmp_path / "step_b4.onnx") is None
    state.record("step_b4.onnx", {"sha256": "0" * 64, "size_bytes": 1})  # and it is rewritten whole
    assert json.loads(path.read_text())["steps"]["step_b4.onnx"] == {"sha256": "0" * 64, "size_bytes": 1}


def test_an_interrupted_export_keeps_the_old_manifest_and_removes_partial_files(
    small_checkpoint, small_decoder, tmp_path, monkeypatch
):
    out = tmp_path / "programs"
    out.mkdir()
    manifest = '{"schema": "vllm-omni-edge/windowed-programs", "old": true}'
    (out / "manifest.json").write_text(manifest)
    (out / ".window_c0_n2.k1ll3d.partial.pt2").write_bytes(b"half a program")

    def killed(*args, **kwargs):
        raise EdgeExportError("killed")

    monkeypatch.setattr(windowed_build, "_export_one", killed)
    request = WindowedExportRequest(model=str(small_checkpoint), out_dir=out, ramp=(2,), context_frames=2)
    with pytest.raises(EdgeExportError, match="killed"):
        export_windowed_programs(request, decoder=small_decoder)
    assert (out / "manifest.json").read_text() == manifest
    assert not list(out.glob(".*partial*"))


def test_an_export_does_not_replace_a_foreign_manifest_without_force(small_checkpoint, tmp_path):
    out = tmp_path / "programs"
    out.mkdir()
    (out / "manifest.json").write_text("my own manifest")
    request = WindowedExportRequest(model=str(small_checkpoint), out_dir=out, ramp=(2,), context_frames=2)
    with pytest.raises(EdgeExportError, match="pass --force"):
        export_windowed_programs(request)
    assert (out / "manifest.json").read_text() == "my own manifest"


def test_remove_partial_files_removes_only_write_atomically_temporaries(tmp_path):
    names = [".step_b4.x1.partial.onnx", ".manifest.y.partial.json", "step_b4.onnx", "partial.onnx", ".hidden"]
    for name in names:
        (tmp_path / name).write_text("x")
    removed = sorted(path.name for path in remove_partial_files(tmp_path))
    assert removed == [".manifest.y.partial.json", ".step_b4.x1.partial.onnx"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [".hidden", "partial.onnx", "step_b4.onnx"]


def test_plan_validate_on_a_runaway_schedule_is_one_line_at_once(tmp_path, capsys):
    from vllm_omni.edge.geometry import CodecGeometry
    from vllm_omni.edge.graphs.window_contract import Window, WindowContract
    from vllm_omni.edge.plan.model import _plan_digest

    codec = CodecGeometry(24000, 48, 16, 2048)
    contract = WindowContract(Window(0, 1), codec).to_json()
    payload = {
        "schema": "vllm-omni-edge/exec-plan",
        "schema_version": 2,
        "hardware_class": "npu_phone",
        "graph_kind": "windowed",
        "backend": "executorch",
        "dtype": "fp32",
        "target": None,
        "model": {"id": "x"},
        **codec.to_json(),
        "device_dir": "/data/x",
        "speech_decoder": {"impl": "executorch", "artifacts": {"window_c0_n1": "/data/x/w.pte"}},
        "artifacts": {"window_c0_n1": {"file": "w.pte", "sha256": "0" * 64, "size_bytes": 1, "contract": contract}},
        "build": {},
        "windowed": {"ramp": [1], "context_frames": 10**8},
    }
    payload["plan_id"] = _plan_digest(payload)
    (tmp_path / "exec_plan.json").write_text(json.dumps(payload))
    started = time.perf_counter()
    assert edge_main(["plan", "validate", str(tmp_path)]) == 1
    assert "windowed.context_frames: 100000000 is greater than the maximum of 4096" in one_error_line(capsys)
    assert time.perf_counter() - started < HANG_SECONDS


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda config: config["decoder_config"].update(hidden_size=-512), "hidden_size must be between 1 and"),
        (lambda config: config["decoder_config"].update(num_key_value_heads=0), "num_key_value_heads must be"),
    ],
)
def test_a_checkpoint_with_a_nonsense_config_is_one_error_line(small_checkpoint, tmp_path, capsys, change, message):
    import shutil

    model = Path(shutil.copytree(small_checkpoint, tmp_path / "model"))
    path = model / "speech_tokenizer" / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
    code = edge_main(["build", "--hardware", "cpu_x86_64", "--model", str(model), "--out", str(tmp_path / "p")])
    assert code == 1 and message in one_error_line(capsys)


def test_a_checkpoint_config_that_is_not_utf8_is_one_error_line(small_checkpoint, tmp_path, capsys):
    import shutil

    model = Path(shutil.copytree(small_checkpoint, tmp_path / "model"))
    (model / "speech_tokenizer" / "config.json").write_bytes(b'{"decoder_config": "\xff\xfe"}')
    code = edge_main(["build", "--hardware", "cpu_x86_64", "--model", str(model), "--out", str(tmp_path / "p")])
    assert code == 1 and "is not valid JSON in UTF-8" in one_error_line(capsys)
