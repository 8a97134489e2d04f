"""What the converter raises, by stage, and the outcome statuses the ``rknn`` builder reads back."""

from __future__ import annotations

from pathlib import Path

from ...backends.rknn.convert import expected_cpu_ops
from ...errors import EdgeError, EdgeExportError
from ...graphs.layouts import NPU_LAYOUT

# Each outcome a conversion reports in its JSON (``status``): the command's exit code, and how the builder says it.
OUTCOMES = {
    "ok": (0, "done"),
    "failed": (1, "a conversion stage failed"),
    "usage": (2, "the converter refused its arguments"),
    "below_bar": (4, "the simulator check missed its bar"),
    "register_overflow": (5, "the toolkit overflowed NPU register fields (REGTASK warnings)"),
    "cpu_ops": (6, "the toolkit placed ops on the CPU that the allow-list does not name, or found no lowering for ops"),
}
EXIT_CODES = {status: code for status, (code, _reason) in OUTCOMES.items()}
OUTCOME_REASONS = {status: reason for status, (code, reason) in OUTCOMES.items() if code}  # the failures


class ConvertUsageError(EdgeError):
    """Arguments that cannot make a conversion (sizes, a missing checkpoint, an unwritable output)."""


class RegisterOverflowError(EdgeExportError):
    """The toolkit printed REGTASK bit-width warnings: a board may truncate those fields and play wrong audio."""

    def __init__(self, counts: dict[str, int], report_path: Path):
        self.counts, self.report_path = counts, report_path
        found = ", ".join(f"{role}: {count:,}" for role, count in counts.items())
        super().__init__(
            f"REGTASK 'bit width of field value exceeds the limit' warnings: expected 0, found {found} "
            f"(report: {report_path}). Export the graph with --graph-layout {NPU_LAYOUT} (the rockchip_npu "
            "builder does), or pass --allow-register-overflow to keep a simulator-only artifact"
        )


class CpuOpsError(EdgeExportError):
    """The toolkit placed op kinds off the NPU that ``EXPECTED_CPU_OPS`` does not name, or found no lowering.

    ``unexpected``: per role, per op kind ``{"count", "nodes", "reason"}`` (an op without a lowering is
    the kind ``"<op> (no lowering)"``); boards have aborted on such an op at run time.
    """

    def __init__(self, unexpected: dict[str, dict[str, dict]], target: str, report_path: Path):
        self.unexpected, self.report_path = unexpected, report_path
        found = "; ".join(
            f"{role}: " + ", ".join(f"{op} x{entry['count']} ({', '.join(entry['nodes'][:3])}"
                                    f"{', ...' if entry['count'] > 3 else ''})" for op, entry in sorted(kinds.items()))
            for role, kinds in unexpected.items()
        )  # fmt: skip
        super().__init__(
            f"ops off the NPU: expected only {', '.join(sorted(expected_cpu_ops(target)))} on the CPU for {target} "
            f"and every op lowered, found {found} (report: {report_path}). A board may abort on them; pass "
            "--allow-cpu-ops to keep a simulator-only artifact"
        )


class SimulatorCheckError(EdgeExportError):
    """The simulator's audio missed the fp16 bar; the report and ``accuracy_analysis`` stay beside the output."""

    def __init__(self, verdict: str, report_path: Path):
        self.report_path = report_path
        super().__init__(
            f"{verdict} (report: {report_path}). The .rknn is not fit to ship: the report's accuracy_analysis "
            "names the first layer whose fp16 output drifts"
        )
