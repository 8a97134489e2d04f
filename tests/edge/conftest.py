"""Artifacts made once per session (small geometry): windowed ``.pt2`` and ``.pte`` programs, phone plans, the
Rockchip plan.

The CPU plan (``cpu_plan``), ``build_plan`` and ``STEP_ARGS`` are in ``tests/conftest.py``.

The phone plans and the Rockchip plan are built in the background (``background_builds``,
:class:`tests.conftest.BackgroundRuns`): ExecuTorch's lowering and the RKNN compile keep one core busy each, so on a
2-core machine one of them runs beside the tests instead of between them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.edge.cli.export import main as export_main

from ..conftest import STEP_ARGS, BackgroundRuns, _build_plan, first_use

REPO_ROOT = Path(__file__).resolve().parents[2]


def edge_build_command(out_dir: Path, *args) -> list[str]:
    """``python -m vllm_omni.edge build --out out_dir *args`` in this venv."""
    return [sys.executable, "-m", "vllm_omni.edge", "build", "--out", str(out_dir), *map(str, args)]


@pytest.fixture(scope="session")
def moderate_checkpoint(tmp_path_factory) -> Path:
    """The small ``moderate`` drive decoder (seed 1): the same speech tokenizer, byte for byte, as the serving
    tests' talker checkpoint (tests/conftest.py), so they can serve the Rockchip plan compiled for it."""
    from vllm_omni.testing.drive import write_drive_checkpoint

    return write_drive_checkpoint(tmp_path_factory.mktemp("ckpt") / "moderate", "small", "moderate", seed=1)


# rockchip_npu: main step B=16 and first step B=4 for rk3588 in one .rknn (dynamic_input), checked in the simulator.
ROCKCHIP_ARGS = ("--hardware", "rockchip_npu", "--step-frames", "16", "--first-step-frames", "4", "--target", "rk3588")
CONVERTER_PYTHON = REPO_ROOT / ".venv-rknn" / "bin" / "python"


@pytest.fixture(scope="session", autouse=True)
def background_builds(request, device_cache, tmp_path_factory):
    """The session's phone and Rockchip builds that a selected test needs, queued in the order the tests need them
    (the first consumer's place in the run) and started with the first test of tests/edge."""
    del device_cache  # set first: the builds inherit its environment variable
    places = first_use(request.session.items)
    builds = BackgroundRuns(lanes=1)
    for _, name in sorted((places[name], name) for name in BACKGROUND if name in places):
        if name == "rockchip_plan" and not CONVERTER_PYTHON.exists():
            continue  # rockchip_plan fails with how to make the converter venv
        checkpoint_fixture, args = BACKGROUND[name]
        out = tmp_path_factory.mktemp("plans") / name
        builds.add(
            name, edge_build_command(out, "--model", request.getfixturevalue(checkpoint_fixture), *args), REPO_ROOT
        )
    builds.start()
    yield builds
    builds.close()


@pytest.fixture(scope="session")
def rockchip_plan(moderate_checkpoint, tmp_path_factory, background_builds) -> tuple[Path, subprocess.CompletedProcess]:
    """rockchip_npu (:data:`ROCKCHIP_ARGS`) on :func:`moderate_checkpoint`: the plan's directory and the completed
    ``edge build`` (ONNX export in this venv, compile and simulator check in the converter venv)."""
    if not CONVERTER_PYTHON.exists():
        pytest.fail("the converter venv is missing: run `make setup-rknn` (make test does)")
    result = background_builds.result("rockchip_plan")
    if result is None:
        command = edge_build_command(tmp_path_factory.mktemp("plans") / "rockchip_plan", "--model", moderate_checkpoint)
        result = subprocess.run([*command, *ROCKCHIP_ARGS], capture_output=True, text=True, cwd=REPO_ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(result.args[result.args.index("--out") + 1]), result


def background_plan(builds: BackgroundRuns, name: str) -> Path | None:
    """The output directory of the background build ``name`` once it succeeded; ``None`` if it was not queued."""
    result = builds.result(name)
    if result is None:
        return None
    assert result.returncode == 0, f"{' '.join(result.args)}:\n{result.stderr[-3000:]}"
    return Path(result.args[result.args.index("--out") + 1])


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
def phone_plan(small_checkpoint, tmp_path_factory, background_builds) -> Path:
    return background_plan(background_builds, "phone_plan") or _build_plan(
        small_checkpoint, tmp_path_factory.mktemp("plans") / "npu_phone", "npu_phone", *PHONE_ARGS
    )


# npu_phone --graph stateful: first step B=2 and main step B=4 as two methods of one steps.pte.
PHONE_STEP_ARGS = ("--graph", "stateful", *STEP_ARGS)


@pytest.fixture(scope="session")
def phone_steps_plan(small_checkpoint, tmp_path_factory, background_builds) -> Path:
    return background_plan(background_builds, "phone_steps_plan") or _build_plan(
        small_checkpoint, tmp_path_factory.mktemp("plans") / "npu_phone_stateful", "npu_phone", *PHONE_STEP_ARGS
    )


# What background_builds builds: fixture -> (the checkpoint fixture, the build's arguments).
BACKGROUND = {
    "phone_steps_plan": ("small_checkpoint", ("--hardware", "npu_phone", *PHONE_STEP_ARGS)),
    "phone_plan": ("small_checkpoint", ("--hardware", "npu_phone", *PHONE_ARGS)),
    "rockchip_plan": ("moderate_checkpoint", ROCKCHIP_ARGS),
}


@pytest.fixture(scope="session")
def near_silent_checkpoint(tmp_path_factory) -> Path:
    """A small random checkpoint whose decode has RMS about 1e-8 (:mod:`vllm_omni.testing.near_silent`)."""
    from vllm_omni.testing.near_silent import write_near_silent_checkpoint

    return write_near_silent_checkpoint(tmp_path_factory.mktemp("ckpt") / "near_silent")
