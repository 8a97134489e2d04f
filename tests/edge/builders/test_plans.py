"""`python -m vllm_omni.edge build` for the windowed class (npu_phone): plan, resume, decoder."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.edge.runtime import WindowedDecoder
from vllm_omni.edge.runtime.open import open_decoder
from vllm_omni.testing.codes import random_codes


def test_the_phone_plan_holds_every_window_as_a_method_of_one_program(phone_plan):
    plan = ExecPlan.load(phone_plan)
    assert (plan.graph_kind, plan.backend, plan.windowed["partitioner"]) == ("windowed", "executorch", "xnnpack")
    assert sorted(plan.artifacts) == ["window_c0_n2", "window_c2_n2"]
    assert {(a.file, a.method) for a in plan.artifacts.values()} == {
        ("windows.pte", "window_c0_n2"),
        ("windows.pte", "window_c2_n2"),
    }
    assert sorted(path.name for path in phone_plan.glob("*.pte")) == ["windows.pte"]
    assert plan.artifacts["window_c2_n2"].contract["inputs"]["audio_codes"] == [1, 16, 4]
    assert plan.artifacts["window_c0_n2"].verification["max_abs_diff"] < 1e-3
    assert plan.speech_decoder["impl"] == "executorch"


def test_the_phone_plan_decodes_exactly_while_the_stream_fits_the_window(phone_plan, small_decoder):
    frames = random_codes(4, 16, 2048, seed=8)[0].T.numpy().copy()
    decoder = open_decoder(phone_plan)
    assert isinstance(decoder, WindowedDecoder)
    audio = np.concatenate([decoder.feed(frames[:1]), decoder.feed(frames[1:]), decoder.flush()])
    with torch.inference_mode():
        reference = small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()
    assert snr_db(reference, audio) >= 90


def test_the_phone_build_kept_the_exported_programs(phone_plan, small_checkpoint, capsys, edge_args, build_plan):
    build_plan(small_checkpoint, phone_plan, "npu_phone", *edge_args["phone"], "--no-check")
    log = capsys.readouterr().err
    assert log.count("kept windows.pte") == 1 and "lowering" not in log


def test_a_replaced_program_fails_validation_naming_the_window(phone_plan, pte_programs, tmp_path):
    copy = Path(shutil.copytree(phone_plan, tmp_path / "plan"))
    (copy / "windows.pte").write_bytes((pte_programs / "window_c0_n2.pte").read_bytes())
    with pytest.raises(ExecPlanError, match=r"artifacts\.window_c0_n2\.(size_bytes|sha256)"):
        ExecPlan.load(copy)


def test_the_browser_plan_keeps_its_weights_beside_the_graph_and_decodes_exactly(
    small_checkpoint, small_decoder, cpu_plan, build_plan, tmp_path
):
    """One graph in the webgpu layout whose weights are an external data file the plan records (sha256 and size
    checked like the graph's, one file for both roles); it decodes exactly in onnxruntime; the CPU classes' plan is
    stale for the browser class and the browser's for the CPU class (``vllm serve`` rebuilds such a plan)."""
    from vllm_omni.edge.backends.onnx.graph import external_data_files, graph_layout
    from vllm_omni.edge.builders.registry import stale_formulation
    from vllm_omni.edge.hardware import get_hardware_class

    out = build_plan(
        small_checkpoint, tmp_path / "browser", "browser", "--step-frames", "4", "--first-step-frames", "2"
    )
    plan = ExecPlan.load(out)
    main, first = plan.artifacts["main"], plan.artifacts["first"]
    assert main.file == first.file and main.external_data == first.external_data is not None
    assert external_data_files(plan.path("main")) == (main.external_data["file"],)
    assert sorted(plan.files()) == sorted([main.file, main.external_data["file"]])
    assert graph_layout(plan.path("main")) == "webgpu" and plan.step_contract("main").codes_dtype == "int32"
    assert plan.path("main").stat().st_size < main.external_data["size_bytes"] // 10  # the graph holds no weights
    assert main.content_sha256 not in (main.sha256, main.external_data["sha256"])
    codes = random_codes(40, 16, plan.codec.codebook_size, seed=5)
    decoder = open_decoder(plan)
    audio = np.concatenate([decoder.feed(codes[0].T.numpy()), decoder.flush()])
    with torch.inference_mode():
        reference = small_decoder(codes).numpy().ravel()
    assert snr_db(reference, audio) >= 100

    browser, cpu = get_hardware_class("browser"), get_hardware_class("cpu_x86_64")
    assert stale_formulation(plan, browser) is None and stale_formulation(ExecPlan.load(cpu_plan), cpu) is None
    assert "time_on_width layout, the class's is webgpu" in stale_formulation(ExecPlan.load(cpu_plan), browser)
    assert "webgpu layout, the class's is time_on_width" in stale_formulation(plan, cpu)

    data = out / main.external_data["file"]
    damaged = bytearray(data.read_bytes())
    damaged[100] ^= 0xFF
    data.write_bytes(bytes(damaged))
    with pytest.raises(ExecPlanError, match=r"artifacts\.main\.external_data"):
        ExecPlan.load(out)
