"""Fuzz: hostile plans (sizes, nesting, types) through ``ExecPlan.load`` and the window schedule (issue 12).

Every case is a valid plan with one or more fields replaced by a hostile value, its ``plan_id``
usually recomputed so that the plan is internally consistent and the checks under test are the
ones that fire. A case passes when ``ExecPlan.load`` returns a plan or raises ``ExecPlanError``, does
not hang (:data:`HANG_SECONDS`), and allocates at most :data:`MAX_ALLOCATED_MB` at once (``tracemalloc``: the
case's own allocations); a loaded plan must also give its schedule and summary. Nothing else (no other
exception type, no hang, no large allocation).

The suite runs :data:`SUITE_CASES` cases; more, e.g. 20,000::

    python -m tests.edge.plan.test_hostile_plans --cases 20000
    HOSTILE_PLAN_CASES=20000 pytest tests/edge/plan/test_hostile_plans.py
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from vllm_omni.edge.geometry import CodecGeometry
from vllm_omni.edge.graphs.step_contract import CacheLayout, StepContract
from vllm_omni.edge.graphs.window_contract import WindowConfigError, WindowContract, check_ramp, window_schedule
from vllm_omni.edge.plan import PLAN_NAME, ExecPlan, ExecPlanError
from vllm_omni.edge.plan.model import PlanArtifact, _plan_digest

SUITE_CASES = 2000
HANG_SECONDS = 60.0  # a case that takes longer hangs (latencies belong in benchmarks, not here)
MAX_ALLOCATED_MB = 300  # the most the loader may allocate at once for one hostile plan
CODEC = CodecGeometry(sample_rate=24000, samples_per_frame=48, num_quantizers=16, codebook_size=2048)
DEEP = "@@DEEP@@"  # replaced in the JSON text by a list nested far deeper than Python's recursion limit


def _write_artifacts(directory: Path, artifacts: dict[str, dict[str, Any]]) -> dict[str, PlanArtifact]:
    rows = {}
    for index, (role, contract) in enumerate(artifacts.items()):
        content = bytes([index + 1]) * (16 + index)
        (directory / f"{role}.bin").write_bytes(content)
        rows[role] = PlanArtifact(
            role, f"{role}.bin", hashlib.sha256(content).hexdigest(), len(content), contract, verification={"ok": 1}
        )
    return rows


def base_plans(directory: Path) -> dict[str, dict[str, Any]]:
    """A valid windowed plan and a valid stateful plan (JSON), their artifacts written into ``directory``."""
    ramp, context = (2, 4), 6
    windows = {w.name: WindowContract(w, CODEC).to_json() for w in window_schedule(ramp, context)}
    windowed = ExecPlan(
        hardware_class="npu_phone",
        graph_kind="windowed",
        backend="executorch",
        dtype="fp32",
        model={"id": "fuzz", "checkpoint_sha256": None, "geometry": {"hidden_size": 64}},
        codec=CODEC,
        artifacts=_write_artifacts(directory, windows),
        windowed={"ramp": list(ramp), "context_frames": context, "partitioner": "xnnpack"},
    )
    layout = CacheLayout.from_shapes([("conv.0", (1, 4, 2)), ("kv.0", (2, 3, 4))])
    steps = {}
    for role, frames in (("main", 4), ("first", 2)):
        contract = StepContract(
            step_frames=frames,
            cache_numel=layout.numel,
            head_dim=4,
            kv_slots=3,
            samples_per_frame=CODEC.samples_per_frame,
            sample_rate=CODEC.sample_rate,
            num_quantizers=CODEC.num_quantizers,
            codebook_size=CODEC.codebook_size,
            rope_inv_freq=(1.0, 0.01),
            layout=layout,
            geometry={"hidden_size": 64},
        )
        steps[role] = contract.to_json()
    stateful = ExecPlan(
        hardware_class="cpu_x86_64",
        graph_kind="stateful",
        backend="onnxruntime",
        dtype="fp32",
        model={"id": "fuzz"},
        codec=CODEC,
        artifacts=_write_artifacts(directory, steps),
    )
    return {"windowed": windowed.to_json(), "stateful": stateful.to_json()}


HOSTILE_VALUES: list[Any] = [
    0,
    -1,
    1,
    2**31,
    10**8,
    10**30,
    -(10**30),
    1.5,
    16.0,
    1e308,
    float("nan"),
    "16",
    "",
    "x" * 5000,
    "../../etc/passwd",
    "/abs",
    "a\u0000b",
    True,
    False,
    None,
    [],
    {},
    [1] * 50_000,
    list(range(300)),
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    {"a": {"b": {"c": {"d": {"e": {}}}}}},
    DEEP,
    [1],
    [2, 4],
    [2, 2],
    ["2", 4],
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys / indices) into ``value``, shortest first."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list) and len(value) <= 64:
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _set(payload: Any, path: tuple, value: Any, delete: bool = False) -> None:
    parent = payload
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value


TARGETED = [  # the probes of issue 12 and their neighbours
    (("windowed", "ramp"), [1]),
    (("windowed", "context_frames"), 10**8),
    (("windowed", "context_frames"), 4096),
    (("windowed", "ramp"), list(range(1, 300))),
    (("artifacts", "main", "contract", "step_frames"), "16"),
    (("artifacts", "main", "contract", "cache_numel"), 10**12),
    (("artifacts", "main", "contract", "cache_layout"), [["x", 0, 10**12, [10**6, 10**6]]]),
    (("artifacts", "main", "contract", "head_dim"), 0),
    (("artifacts", "main", "contract", "rope_inv_freq"), [1e308] * 50_000),
    (("num_quantizers",), 10**9),
]


def hostile_case(bases: dict[str, dict[str, Any]], rng: random.Random) -> tuple[str, str]:
    """``(description, plan JSON text)`` of one hostile plan."""
    kind = rng.choice(sorted(bases))
    payload = copy.deepcopy(bases[kind])
    changes = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if rng.random() < 0.15:
            path, value = rng.choice(TARGETED)
            if (path[0], kind) in (("artifacts", "windowed"), ("windowed", "stateful")):
                continue
        else:
            path, value = rng.choice(_paths(payload)[1:]), rng.choice(HOSTILE_VALUES)
        delete = rng.random() < 0.1
        try:
            _set(payload, path, copy.deepcopy(value), delete=delete)
        except (KeyError, IndexError, TypeError):
            continue
        changes.append(f"{'del ' if delete else ''}{'.'.join(map(str, path))}={str(value)[:40]}")
    if rng.random() < 0.8:  # internally consistent: the semantic checks, not plan_id, must catch it
        body = {k: v for k, v in payload.items() if k != "plan_id"}
        # artifacts replaced by a non-object: no digest to compute, the schema refuses the plan anyway
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            payload["plan_id"] = _plan_digest(body)
    text = json.dumps(payload)
    text = text.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)
    return f"{kind}: {'; '.join(changes)}", text


def run_cases(cases: int, seed: int = 0) -> dict[str, int]:
    """Run ``cases`` hostile plans; raise ``AssertionError`` naming the first case that misbehaves."""
    rng = random.Random(seed)
    outcomes = {"loaded": 0, "refused": 0}
    peak = 0
    with tempfile.TemporaryDirectory(prefix="hostile-plans-") as scratch:
        directory = Path(scratch)
        bases = base_plans(directory)
        for payload in bases.values():  # the bases themselves are valid
            (directory / PLAN_NAME).write_text(json.dumps(payload))
            ExecPlan.load(directory)
        for index in range(cases):
            what, text = hostile_case(bases, rng)
            (directory / PLAN_NAME).write_text(text)
            started = time.perf_counter()
            # Traced from here only: the case's own allocations (not what earlier tests left in the process's
            # peak RSS, nor the case's making, which ran nine times slower traced).
            tracemalloc.start()
            try:
                plan = ExecPlan.load(directory)
                if plan.graph_kind == "windowed":
                    assert plan.schedule, what
                plan.summary()
                outcomes["loaded"] += 1
            except ExecPlanError:
                outcomes["refused"] += 1
            except Exception as exc:
                raise AssertionError(f"case {index} ({what}): {type(exc).__name__}: {str(exc)[:300]}") from exc
            finally:
                case_peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            seconds = time.perf_counter() - started
            assert seconds < HANG_SECONDS, f"case {index} ({what}) took {seconds:.2f} s"
            assert case_peak < MAX_ALLOCATED_MB << 20, f"case {index} ({what}) allocated {case_peak >> 20} MB"
            peak = max(peak, case_peak)
    outcomes["peak_mb"] = peak >> 20
    return outcomes


def test_hostile_plans_are_loaded_or_refused_with_an_exec_plan_error_quickly():
    cases = int(os.environ.get("HOSTILE_PLAN_CASES", SUITE_CASES))
    outcomes = run_cases(cases, seed=int(os.environ.get("HOSTILE_PLAN_SEED", 0)))
    assert outcomes["refused"] > cases // 2  # most hostile values are caught
    assert outcomes["loaded"] > 0  # and harmless ones (e.g. in the free-form model block) still load


def test_the_schedule_of_a_huge_context_is_refused_before_it_is_computed():
    started = time.perf_counter()
    for ramp, context in (([1], 10**8), ([1], 4096), (list(range(1, 300)), 72)):
        tracemalloc.start()
        try:
            window_schedule(ramp, context)
        except WindowConfigError as exc:
            assert "at most" in str(exc)
        else:
            raise AssertionError(f"ramp {ramp[:3]}... context {context} was accepted")
        finally:
            allocated = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert allocated < 1 << 20, f"{allocated} bytes allocated: the schedule was computed before the refusal"
    assert time.perf_counter() - started < HANG_SECONDS


def test_the_window_count_limit_is_exact_at_the_boundary():
    # ramp [16], context 4080: 0+16, 16+16, ..., 4080+16 = 256 windows; one more frame of context is 257.
    assert len(window_schedule([16], 4080)) == 256
    try:
        check_ramp([16], 4081)
    except WindowConfigError as exc:
        assert "needs 257 windows" in str(exc)
    else:
        raise AssertionError("257 windows accepted")


def test_a_symlinked_artifact_is_refused_even_when_size_and_sha256_match(tmp_path):
    directory = tmp_path / "plan"
    directory.mkdir()
    payload = base_plans(directory)["stateful"]
    (directory / PLAN_NAME).write_text(json.dumps(payload))
    outside = tmp_path / "outside.bin"
    outside.write_bytes((directory / "main.bin").read_bytes())
    (directory / "main.bin").unlink()
    (directory / "main.bin").symlink_to(outside)
    try:
        ExecPlan.load(directory)
    except ExecPlanError as exc:
        assert "artifacts.main.file: main.bin is a link" in str(exc)
    else:
        raise AssertionError("a symlink to a file outside the plan directory validated")


def test_a_string_where_a_step_size_belongs_is_refused(tmp_path):
    payload = base_plans(tmp_path)["stateful"]
    payload["artifacts"]["main"]["contract"]["step_frames"] = "4"
    payload["plan_id"] = _plan_digest({k: v for k, v in payload.items() if k != "plan_id"})
    (tmp_path / PLAN_NAME).write_text(json.dumps(payload))
    try:
        ExecPlan.load(tmp_path)
    except ExecPlanError as exc:
        assert "step_frames must be an integer" in str(exc)
    else:
        raise AssertionError('step_frames "4" accepted')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.edge.plan.test_hostile_plans", description=__doc__)
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    outcomes = run_cases(args.cases, args.seed)
    print(f"{args.cases} hostile plans in {time.perf_counter() - started:.1f} s: {outcomes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
