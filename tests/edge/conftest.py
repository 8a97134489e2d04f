"""Artifacts made once per session (small geometry): windowed ``.pt2`` and ``.pte`` programs, phone plans.

The CPU plan (``cpu_plan``), ``build_plan`` and ``STEP_ARGS`` are in ``tests/conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.edge.cli.export import main as export_main

from ..conftest import STEP_ARGS, _build_plan

# .pt2: windows 0+2, 2+4, 4+4 (a ramp and the steady state). .pte (about 45 s of lowering per
# program on 2 cores): windows 0+2 and 2+2, whose context is the whole stream so far.
PT2_ARGS = ("--ramp", "2", "4", "--context", "4", "--backend", "torch_export")
PTE_ARGS = ("--ramp", "2", "--context", "2", "--backend", "executorch")


def _export_programs(checkpoint: Path, out_dir: Path, *args: str) -> Path:
    assert export_main(["--model", str(checkpoint), "--out-dir", str(out_dir), *args]) == 0
    return out_dir


@pytest.fixture(scope="session")
def export_programs():
    """``export_programs(checkpoint, out_dir, *args)``: the windowed export's CLI, which must succeed."""
    return _export_programs


@pytest.fixture(scope="session")
def edge_args() -> dict[str, tuple[str, ...]]:
    """The sizes the session's artifacts use: ``pt2``, ``pte`` (export args), ``step``, ``phone``, ``phone_step``
    (build args)."""
    return {"pt2": PT2_ARGS, "pte": PTE_ARGS, "step": STEP_ARGS, "phone": PHONE_ARGS, "phone_step": PHONE_STEP_ARGS}


@pytest.fixture(scope="session")
def pt2_programs(small_checkpoint, tmp_path_factory) -> Path:
    return _export_programs(small_checkpoint, tmp_path_factory.mktemp("programs") / "pt2", *PT2_ARGS)


@pytest.fixture(scope="session")
def pte_programs(small_checkpoint, tmp_path_factory) -> Path:
    return _export_programs(small_checkpoint, tmp_path_factory.mktemp("programs") / "pte", *PTE_ARGS)


# npu_phone over the same windows as the session's .pte programs (PTE_ARGS): 0+2 and 2+2, here as two
# methods of one windows.pte (the weights once; about a minute of lowering on 2 cores).
PHONE_ARGS = ("--ramp", "2", "--context", "2")


@pytest.fixture(scope="session")
def phone_plan(small_checkpoint, tmp_path_factory) -> Path:
    return _build_plan(small_checkpoint, tmp_path_factory.mktemp("plans") / "npu_phone", "npu_phone", *PHONE_ARGS)


# npu_phone --graph stateful: first step B=2 and main step B=4 as two methods of one steps.pte.
PHONE_STEP_ARGS = ("--graph", "stateful", *STEP_ARGS)


@pytest.fixture(scope="session")
def phone_steps_plan(small_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plans") / "npu_phone_stateful"
    return _build_plan(small_checkpoint, out, "npu_phone", *PHONE_STEP_ARGS)


@pytest.fixture(scope="session")
def near_silent_checkpoint(tmp_path_factory) -> Path:
    """A small random checkpoint whose decode has RMS about 1e-8 (:mod:`vllm_omni.edge.testing.near_silent`)."""
    from vllm_omni.edge.testing.near_silent import write_near_silent_checkpoint

    return write_near_silent_checkpoint(tmp_path_factory.mktemp("ckpt") / "near_silent")
