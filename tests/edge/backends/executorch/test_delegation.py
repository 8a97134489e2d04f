"""The delegation report: operators outside XNNPACK by kind, their FLOPs (as torch counts them) and profiled time."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vllm_omni.edge.backends.executorch.delegation import (
    DelegationReport,
    OutsideOps,
    count_flops,
    op_kind,
)
from vllm_omni.edge.backends.executorch.export import ExecuTorchProgramWriter
from vllm_omni.edge.backends.executorch.run import profile_outside_time


class TableThenLinear(nn.Module):
    """An int64 lookup (XNNPACK takes no ``embedding``) feeding a linear layer and a sine (both delegated)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(64, 32))
        self.linear = nn.Linear(32, 48)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.linear(nn.functional.embedding(codes, self.table)))


def test_op_kinds_from_edge_aten_and_profiler_names():
    assert op_kind(torch.ops.aten.select_copy.int) == "select_copy"
    assert op_kind(torch.ops.aten.mm.default) == "mm"
    assert op_kind("native_call_select_copy.int_out") == "select_copy"
    assert op_kind("native_call_embedding.out") == "embedding"


def test_flops_are_torchs_matmul_count_plus_one_per_element_of_other_arithmetic():
    module, codes = TableThenLinear().eval(), torch.randint(0, 64, (5,))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(codes)
    assert counter.get_total_flops() == 2 * 5 * 32 * 48  # the linear layer only
    # + the bias add (5 x 48, when the linear is not one addmm) and the sine (5 x 48); the lookup is data movement
    assert count_flops(module, (codes,)) in (counter.get_total_flops() + 5 * 48, counter.get_total_flops() + 2 * 5 * 48)


def test_a_lowered_program_reports_its_lookup_outside_and_its_time(tmp_path):
    module, codes = TableThenLinear().eval(), torch.randint(0, 64, (5,))
    exported = torch.export.export(module, (codes,))
    path = tmp_path / "table.pte"
    ops = ExecuTorchProgramWriter("xnnpack").write_methods({"forward": (exported, {})}, path)
    report = DelegationReport.from_json(ops["forward"]["delegation"])
    assert report.delegate == "xnnpack" and report.delegate_calls == 1
    assert [(ops.kind, ops.count, ops.flops) for ops in report.outside] == [("embedding", 1, 0)]
    assert report.delegated_flops_share == 1.0 and report.flops == count_flops(module, (codes,))
    assert report.outside_time_share is None  # not profiled yet

    outside_seconds, step_seconds = profile_outside_time(path, "forward", [codes])
    assert set(outside_seconds) == {"embedding"} and 0 < outside_seconds["embedding"] < step_seconds
    profiled = report.with_profile(outside_seconds, step_seconds)
    assert 0 < profiled.outside_time_share < 1 and profiled.time_share("embedding") == profiled.outside_time_share
    assert profiled.summary().startswith("forward: 100.00% of ") and "embedding x1" in profiled.summary()
    assert DelegationReport.from_json(profiled.to_json()) == profiled


def test_outside_arithmetic_lowers_the_delegated_share():
    report = DelegationReport(
        method="step_b2",
        delegate="xnnpack",
        delegate_calls=3,
        flops=1000,
        outside=(OutsideOps("mean", 5, 10), OutsideOps("select_copy", 2, 0)),
    )
    assert report.delegated_flops_share == 0.99
    assert "mean x5, select_copy x2" in report.summary()
