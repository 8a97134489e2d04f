"""Where rknn-toolkit2 places a build's ops, read from its verbose log, and the gate on ops off the NPU.

No toolkit here: the log excerpt below is a shortened copy of a real rknn-toolkit2 2.5.0 verbose build
of the earlier step graph (split K/V attention, ``dynamic_input`` at B=2 and B=4, rk3588; fewer rows, the
columns' padding narrowed), whose V selection matmul became an Einsum on the CPU without a lowering.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_omni.edge.backends.rknn.convert import EXPECTED_CPU_OPS, captured_output, expected_cpu_ops, parse_placement

SEP = "D RKNN: [05:30:19.776] " + "-" * 90
LAYER_TABLE = f"""\
D RKNN: [05:30:19.753] >>>>>> start: rknn::RKNNModelRegCmdbuildPass
{SEP}
D RKNN: [05:30:19.776] Network Layer Information Table
{SEP}
D RKNN: [05:30:19.776] ID  OpType  DataType Target InputShape  OutputShape  Cycles(DDR/NPU/Total)  RW(KB)  FullName
{SEP}
D RKNN: [05:30:19.776] 0  InputOperator  INT64  CPU  \\  (1,16,4)  0/0/0  0  InputOperator:audio_codes
D RKNN: [05:30:19.776] 4  Reshape  INT64  CPU  (1,16,4),(4)  (1,16,1,4)  0/0/0  0  Reshape:audio_codes_rs
D RKNN: [05:30:19.776] 5  Split  INT64  CPU  (1,16,1,4),(16)  (1,1,1,4),...  0/0/0  0  Split:/Slice_2sp
D RKNN: [05:30:19.776] 22  Gather  FLOAT16  CPU  (2048,32),(1,4)  (1,4,32)  0/0/0  128  Gather:/Gather_1
D RKNN: [05:30:19.776] 23  Gather  FLOAT16  CPU  (2048,32),(1,4)  (1,4,32)  0/0/0  128  Gather:/Gather_3
D RKNN: [05:30:19.776] 80  Sin  FLOAT16  CPU  (1,32,1,4)  (1,32,1,4)  0/0/0  0  Sin:/Sin
D RKNN: [05:30:19.776] 88  exMatMul  FLOAT16  NPU  (11,7,1,1),(2,7,1,32)  (2,11,1,32)  138/64/138  1  exMatMul:/MatMul#1
D RKNN: [05:30:19.776] 90  Einsum  FLOAT16  CPU  (11,7,1,1),(2,7,32)  (2,11,32)  0/0/0  1  Einsum:/MatMul_2
D RKNN: [05:30:19.776] 118  Transpose  FLOAT16  CPU  (2,32,4)  (2,4,32)  0/0/0  0  Transpose:/Transpose_19#1
D RKNN: [05:30:19.776] 141  Conv  FLOAT16  NPU  (1,2,1,352),(4,2,1,1)  (1,4,1,352)  479/704/704  5  Conv:/MatMul_6#2
D RKNN: [05:30:19.776] 400  OutputOperator  FLOAT16  CPU  (7808)  \\  0/0/0  0  OutputOperator:cache_out
{SEP}
D RKNN: [05:30:19.776] <<<<<<<< end: rknn::RKNNModelRegCmdbuildPass
D RKNN: [05:30:19.778] Feature Tensor Information Table
D RKNN: [05:30:19.778] ID  User  Tensor  DataType  DataFormat  OrigShape  NativeShape  |  [Start  End)  Size
D RKNN: [05:30:19.778] 4  Reshape  audio_codes  INT64  UNDEFINED  (1,16,4)  (1,16,4)  | 0x00000000 0x00000200 0x00000200
"""
# dynamic_input compiles one graph per shape set: a second table (B=2); librknnc's lines come at the end.
BUILD_LOG = (
    LAYER_TABLE
    + LAYER_TABLE.replace("Einsum:/MatMul_2", "Einsum:/MatMul_12").replace("(1,16,4)", "(1,16,2)")
    + """\
I rknn building done.
No lowering found for: /MatMul_2, node type = Einsum, use CustomOperatorLower instead.
No lowering found for: /MatMul_12, node type = Einsum, use CustomOperatorLower instead.
No lowering found for: /MatMul_2, node type = Einsum, use CustomOperatorLower instead.
"""
)


def test_the_verbose_log_gives_each_cpu_op_kind_with_count_nodes_and_reason():
    placement = parse_placement(BUILD_LOG, "rk3588")
    assert placement.graphs == 2 and placement.npu_ops == [2, 2] and placement.cpu_op_count == [7, 7]
    assert set(placement.cpu_ops) == {"Reshape", "Split", "Gather", "Sin", "Einsum", "Transpose"}  # no Input/Output
    assert placement.cpu_ops["Gather"] == {
        "count": 2,  # each node once over both compiled graphs
        "nodes": ["/Gather_1", "/Gather_3"],
        "reason": EXPECTED_CPU_OPS["Gather"],
    }
    assert placement.cpu_ops["Einsum"]["nodes"] == ["/MatMul_2", "/MatMul_12"]
    assert placement.cpu_ops["Einsum"]["reason"] == "not in EXPECTED_CPU_OPS for rk3588"
    assert placement.cpu_ops["Reshape"]["nodes"] == ["audio_codes_rs"]  # the feature tensor table is not read
    assert placement.no_lowering == [{"node": "/MatMul_2", "op": "Einsum"}, {"node": "/MatMul_12", "op": "Einsum"}]
    assert placement.describe() == (
        "on the CPU: Einsum x2, Gather x2, Reshape x1, Sin x1, Split x1, Transpose x1; 2 without a lowering"
    )


def test_the_allow_list_names_sin_only_where_the_npu_has_none():
    assert {"Gather", "Split", "Reshape", "Sub"} == set(EXPECTED_CPU_OPS)
    assert {"Sin", "Cos"} <= set(expected_cpu_ops("rk3588")) and "Sin" not in expected_cpu_ops("rk3576")
    assert set(parse_placement(BUILD_LOG, "rk3588").unexpected("rk3588")) == {
        "Einsum",
        "Transpose",
        "Einsum (no lowering)",
    }
    unexpected = parse_placement(BUILD_LOG, "rk3576").unexpected("rk3576")
    assert set(unexpected) == {"Einsum", "Transpose", "Sin", "Einsum (no lowering)"}
    assert (
        unexpected["Einsum (no lowering)"]["count"] == 2
        and "a board may abort" in unexpected["Einsum (no lowering)"]["reason"]
    )


def test_c_stdio_buffered_inside_the_capture_lands_in_the_log(tmp_path):
    """librknnc prints through C stdio, fully buffered when stdout is not a terminal: without a flush its lines
    reach the terminal at process exit, after the capture ended (as `make demo` showed)."""
    log = tmp_path / "build.log"
    script = textwrap.dedent(f"""
        import ctypes
        from pathlib import Path
        from vllm_omni.edge.backends.rknn.convert import captured_output
        with captured_output(Path({str(log)!r}), workdir=Path({str(tmp_path)!r})):
            ctypes.CDLL(None).printf(b"No lowering found for: /MatMul_3, node type = Einsum, use X instead.\\n")
            assert Path.cwd() == Path({str(tmp_path)!r})
        print("after the capture")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "after the capture\n"
    assert "No lowering found for: /MatMul_3" in log.read_text()
    assert captured_output  # the same function the build uses


def fake_build(placement: dict):
    """``build_engine`` stand-in whose report carries ``placement`` (no toolkit)."""
    from vllm_omni.edge.backends.rknn.convert import EngineReport

    class FakeEngine:
        def __init__(self, output):
            output.write_bytes(b"rknn")
            self.report = EngineReport(
                str(output), "rk3588", 4, "0" * 64, "fake", build_seconds=1.0, regtask_warnings=0, placement=placement
            )

        def release(self):
            pass

    return lambda onnx_path, output, **_: FakeEngine(output)


@pytest.fixture(scope="module")
def step_graph(small_decoder, tmp_path_factory):
    from vllm_omni.edge.builders.onnx.steps import export_checked_step

    path = tmp_path_factory.mktemp("graph") / "step_b4.onnx"
    return export_checked_step(small_decoder, 4, path, graph_layout="time_on_height")


def converter_with_placement(placement: dict, step_graph: Path, tmp_path: Path, monkeypatch) -> Path:
    """The converter with ``build_engine`` reporting ``placement`` and a passing simulator check (no toolkit);
    returns a copy of the step graph in ``tmp_path`` to convert."""
    from vllm_omni.edge.builders.rknn import convert as rknn_convert

    check = {"passed": True, "verdict": "fake", "frames": 80, "steps": [4] * 20, "per_step_snr_db": [60.0] * 20}
    check |= {"min_step_snr_db": 60.0, "mean_step_snr_db": 60.0, "snr_db_vs_onnxruntime": 60.0}
    monkeypatch.setattr(rknn_convert, "build_engine", fake_build(placement))
    monkeypatch.setattr(rknn_convert, "simulator_check", lambda *_: check)
    graph = tmp_path / "step_b4.onnx"
    graph.write_bytes(step_graph.read_bytes())
    return graph


def test_an_op_off_the_npu_beyond_the_allow_list_fails_the_conversion_unless_allowed(step_graph, tmp_path, monkeypatch):
    from vllm_omni.edge.builders.rknn import convert as rknn_convert
    from vllm_omni.edge.plan import ExecPlan

    placement = vars(parse_placement(BUILD_LOG, "rk3588"))
    graph = converter_with_placement(placement, step_graph, tmp_path, monkeypatch)
    request = rknn_convert.ConvertRequest(output=tmp_path / "step_b4.rknn", onnx=graph)
    with pytest.raises(rknn_convert.CpuOpsError) as caught:
        rknn_convert.compile_and_check(request, {"main": graph}, None)
    message = str(caught.value)
    assert "found main: Einsum x2 (/MatMul_2, /MatMul_12), Einsum (no lowering) x2" in message
    assert "Transpose x1 (/Transpose_19#1)" in message and "--allow-cpu-ops" in message and "Gather x" not in message
    assert set(caught.value.unexpected["main"]) == {"Einsum", "Transpose", "Einsum (no lowering)"}
    report = json.loads(caught.value.report_path.read_text())
    assert report["placement"]["main"]["cpu_ops"]["Gather"]["count"] == 2 and not report["cpu_ops_allowed"]
    assert not (tmp_path / "exec_plan.json").exists()

    allowed = rknn_convert.ConvertRequest(output=tmp_path / "step_b4.rknn", onnx=graph, allow_cpu_ops=True)
    result = rknn_convert.compile_and_check(allowed, {"main": graph}, None)
    plan = ExecPlan.load(tmp_path)
    assert plan.build["cpu_ops_allowed"] and plan.build["placement"]["main"]["no_lowering"][0]["node"] == "/MatMul_2"
    assert json.loads(result.report_path.read_text())["cpu_ops_allowed"]


def test_a_clean_placement_passes_and_is_recorded_in_the_plan(step_graph, tmp_path, monkeypatch):
    from vllm_omni.edge.builders.rknn import convert as rknn_convert
    from vllm_omni.edge.plan import ExecPlan

    clean = "\n".join(
        line for line in LAYER_TABLE.splitlines() if not any(op in line for op in ("Einsum", "Transpose"))
    )
    placement = vars(parse_placement(clean, "rk3588"))
    graph = converter_with_placement(placement, step_graph, tmp_path, monkeypatch)
    request = rknn_convert.ConvertRequest(output=tmp_path / "step_b4.rknn", onnx=graph)
    rknn_convert.compile_and_check(request, {"main": graph}, None)
    build = ExecPlan.load(tmp_path).build
    assert set(build["placement"]["main"]["cpu_ops"]) == {"Reshape", "Split", "Gather", "Sin"}
    assert build["placement"]["main"]["no_lowering"] == [] and build["cpu_ops_allowed"] is False


def test_the_converter_says_cpu_ops_with_its_own_exit_code(tmp_path, monkeypatch):
    from vllm_omni.edge.builders.rknn import convert as rknn_convert
    from vllm_omni.edge.builders.rknn.build import OUTCOME_REASONS
    from vllm_omni.edge.cli import rknn_convert as cli

    unexpected = {"main": {"Einsum": {"count": 1, "nodes": ["/MatMul_2"], "reason": "not in EXPECTED_CPU_OPS"}}}

    def refuse(request, report):
        assert not request.allow_cpu_ops
        raise rknn_convert.CpuOpsError(unexpected, "rk3588", tmp_path / "step.report.json")

    monkeypatch.setattr(rknn_convert, "run", refuse)
    outcome = tmp_path / "outcome.json"
    code = cli.main(["--onnx", str(tmp_path / "step.onnx"), "--output", str(tmp_path / "step.rknn"),
                     "--outcome-json", str(outcome)])  # fmt: skip
    assert code == cli.EXIT_CODES["cpu_ops"] == 6
    written = json.loads(outcome.read_text())
    assert written["status"] == "cpu_ops" and "Einsum x1 (/MatMul_2)" in written["error"]
    assert "--allow-cpu-ops" in written["error"] and "cpu_ops" in OUTCOME_REASONS
