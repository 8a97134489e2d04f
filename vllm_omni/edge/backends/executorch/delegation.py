"""How much of an ExecuTorch method runs in its delegate: the operators left outside, by kind, and their cost.

After lowering, every operator the partitioner did not take stays in the method's graph and runs
on ExecuTorch's portable kernels (one thread, no SIMD packing). :func:`delegation_report` lists
them by kind with their count and their share of the method's FLOPs; :func:`~.run.profile_outside_time`
runs the written program in the runtime with its ETDump profiler; :meth:`DelegationReport.with_profile`
adds each kind's share of the step's time.

FLOPs are counted as ``torch.utils.flop_counter`` counts matrix products and convolutions (two per
multiply-accumulate), one per element of the largest operand for any other arithmetic, and none
for data movement (views, copies, slices, concatenation, gathers such as ``embedding``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

# Operators that only move or create data: no arithmetic, so no FLOPs.
DATA_MOVEMENT = frozenset(
    {
        "_reshape_alias",
        "_to_copy",
        "_to_dim_order",
        "_unsafe_view",
        "alias",
        "arange",
        "as_strided",
        "cat",
        "clone",
        "constant_pad_nd",
        "contiguous",
        "copy",
        "detach",
        "embedding",
        "empty",
        "empty_like",
        "expand",
        "flatten",
        "full",
        "full_like",
        "gather",
        "index",
        "index_select",
        "lift_fresh",
        "narrow",
        "new_empty",
        "new_zeros",
        "ones",
        "ones_like",
        "permute",
        "repeat",
        "repeat_interleave",
        "reshape",
        "scalar_tensor",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "stack",
        "t",
        "transpose",
        "unbind",
        "unfold",
        "unsqueeze",
        "view",
        "zeros",
        "zeros_like",
    }
)
DELEGATE_CALL = "executorch_call_delegate"


def op_kind(target: Any) -> str:
    """``aten.select_copy.int`` (an edge or ATen operator, or a profiler's ``native_call_select_copy.int_out``)
    -> ``select_copy``."""
    schema = getattr(getattr(target, "_op", target), "_schema", None)
    name = schema.name if schema is not None else str(getattr(target, "__name__", target))
    name = name.removeprefix("native_call_").split("::")[-1]
    return name.removeprefix("aten.").split(".")[0]


def _is_data_movement(kind: str) -> bool:
    return kind.removesuffix("_copy") in DATA_MOVEMENT or kind in DATA_MOVEMENT


def op_flops(op: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one call of ATen operator ``op`` with these (real or fake) tensors; see the module docstring."""
    import torch
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import flop_registry

    packet = getattr(op, "overloadpacket", None)
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    if _is_data_movement(op_kind(op)):
        return 0
    sizes = [leaf.numel() for leaf in tree_leaves((args, kwargs, out)) if isinstance(leaf, torch.Tensor)]
    return max(sizes, default=0)


def count_flops(module: Any, inputs: tuple) -> int:
    """FLOPs of one call ``module(*inputs)`` (run eagerly, counted per dispatched ATen operator)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            Counting.total += op_flops(func, args, kwargs, out)
            return out

    with torch.no_grad(), Counting():
        module(*inputs)
    return Counting.total


def _node_flops(node: Any) -> int:
    import torch.fx
    from torch.utils._pytree import tree_map

    def value(arg: Any) -> Any:
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    op = getattr(node.target, "_op", node.target)
    return op_flops(op, tree_map(value, node.args), tree_map(value, node.kwargs), node.meta.get("val"))


@dataclass(frozen=True)
class OutsideOps:
    """One kind of operator left outside the delegate: how many, their FLOPs, and (profiled) their seconds per call."""

    kind: str
    count: int
    flops: int
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        row = {"kind": self.kind, "count": self.count, "flops": self.flops}
        return row if self.seconds is None else {**row, "seconds": self.seconds}


@dataclass(frozen=True)
class DelegationReport:
    """What of one method runs in ``delegate``; ``step_seconds`` and the outside seconds come from a profile."""

    method: str
    delegate: str
    delegate_calls: int
    flops: int
    outside: tuple[OutsideOps, ...] = field(default=())
    step_seconds: float | None = None

    @property
    def outside_flops(self) -> int:
        return sum(ops.flops for ops in self.outside)

    @property
    def delegated_flops_share(self) -> float:
        return 1.0 - self.outside_flops / self.flops if self.flops else 1.0

    @property
    def outside_time_share(self) -> float | None:
        if self.step_seconds is None or any(ops.seconds is None for ops in self.outside):
            return None
        return sum(ops.seconds for ops in self.outside) / self.step_seconds if self.step_seconds else 0.0

    def time_share(self, kind: str) -> float | None:
        """The share of the step's profiled time spent in the outside operators of ``kind``."""
        ops = {ops.kind: ops for ops in self.outside}.get(kind)
        if ops is None or ops.seconds is None or not self.step_seconds:
            return None
        return ops.seconds / self.step_seconds

    def with_profile(self, outside_seconds: dict[str, float], step_seconds: float) -> DelegationReport:
        """This report with the profiled seconds per call of each outside kind (0 where none was seen).

        A kind the profile saw that the graph did not name (a kernel the runtime inserted) is added with
        its time, so the outside share is never under-counted.
        """
        outside = tuple(replace(ops, seconds=outside_seconds.get(ops.kind, 0.0)) for ops in self.outside)
        named = {ops.kind for ops in self.outside}
        extra = tuple(OutsideOps(kind, 0, 0, seconds) for kind, seconds in outside_seconds.items() if kind not in named)
        return replace(self, outside=outside + extra, step_seconds=step_seconds)

    def summary(self) -> str:
        """One line, e.g. ``step_b16: 100.00% of 80 GFLOP in 1 xnnpack call(s); outside: select_copy x17, embedding
        x16, cat x1, 0.01% of the step's time``."""
        outside = ", ".join(f"{ops.kind} x{ops.count}" for ops in self.outside) or "nothing"
        text = (
            f"{self.method}: {100 * self.delegated_flops_share:.2f}% of {self.flops / 1e9:.3g} GFLOP in "
            f"{self.delegate_calls} {self.delegate} call(s); outside: {outside}"
        )
        share = self.outside_time_share
        return text if share is None else f"{text}, {100 * share:.2f}% of the step's time"

    def to_json(self) -> dict[str, Any]:
        row = {
            "method": self.method,
            "delegate": self.delegate,
            "delegate_calls": self.delegate_calls,
            "flops": self.flops,
            "delegated_flops_share": self.delegated_flops_share,
            "outside": [ops.to_json() for ops in self.outside],
            "summary": self.summary(),
        }
        if self.step_seconds is not None:
            row["step_seconds"] = self.step_seconds
            row["outside_time_share"] = self.outside_time_share
        return row

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> DelegationReport:
        return cls(
            method=str(row["method"]),
            delegate=str(row["delegate"]),
            delegate_calls=int(row["delegate_calls"]),
            flops=int(row["flops"]),
            outside=tuple(
                OutsideOps(str(o["kind"]), int(o["count"]), int(o["flops"]), o.get("seconds")) for o in row["outside"]
            ),
            step_seconds=row.get("step_seconds"),
        )


def delegation_report(method: str, delegate: str, lowered: Any, flops: int) -> DelegationReport:
    """The operators of ``lowered`` (a lowered method's graph module) outside ``delegate``, by kind.

    ``flops``: the whole method's FLOPs (:func:`count_flops` of the exported program).
    """
    counts: Counter[str] = Counter()
    kind_flops: Counter[str] = Counter()
    calls = 0
    for node in lowered.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__name__", "") == "getitem":
            continue
        if DELEGATE_CALL in str(node.target):
            calls += 1
            continue
        kind = op_kind(node.target)
        counts[kind] += 1
        kind_flops[kind] += _node_flops(node)
    outside = tuple(OutsideOps(kind, count, kind_flops[kind]) for kind, count in counts.most_common())
    return DelegationReport(method, delegate, calls, flops, outside)
