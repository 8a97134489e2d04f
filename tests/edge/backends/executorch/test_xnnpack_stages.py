"""XNNPACK partitions cut into stages by their weights: graph-order runs, one delegate each, same results."""

from __future__ import annotations

import torch
from torch import nn

from vllm_omni.edge.backends.executorch.delegation import DelegationReport
from vllm_omni.edge.backends.executorch.export import ExecuTorchProgramWriter
from vllm_omni.edge.backends.executorch.run import load_program


class ThreeLayers(nn.Module):
    """Weights of 64 KiB, 64 KiB and 256 KiB (fp32), the last a non-persistent buffer, then weightless ops."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(128, 128, bias=False)
        self.second = nn.Linear(128, 128, bias=False)
        self.register_buffer("third", torch.randn(512, 128), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.second(torch.relu(self.first(hidden))))
        return torch.sigmoid(nn.functional.linear(hidden, self.third)) * 2.0


def lower(tmp_path, max_stage_bytes: int) -> tuple[DelegationReport, torch.Tensor]:
    module, hidden = ThreeLayers().eval(), torch.randn(3, 128)
    exported = torch.export.export(module, (hidden,))
    path = tmp_path / f"stages_{max_stage_bytes}.pte"
    ops = ExecuTorchProgramWriter("xnnpack", max_stage_bytes=max_stage_bytes).write_methods(
        {"forward": (exported, {})}, path
    )
    (out,) = load_program(path).load_method("forward").execute([hidden])
    with torch.no_grad():
        assert torch.allclose(out, module(hidden), atol=1e-5)
    return DelegationReport.from_json(ops["forward"]["delegation"]), out


def test_each_stage_holds_at_most_the_budget_and_an_oversized_layer_stands_alone(tmp_path):
    report, _ = lower(tmp_path, 100 * 1024)
    # 64 KiB | 64 KiB | 256 KiB (over the budget, alone); the weightless ops after it stay in its stage
    assert report.delegate_calls == 3 and report.delegated_flops_share == 1.0 and not report.outside


def test_a_budget_over_all_weights_keeps_one_delegate(tmp_path):
    report, _ = lower(tmp_path, 2**20)
    assert report.delegate_calls == 1
