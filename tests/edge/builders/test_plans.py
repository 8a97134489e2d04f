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
from vllm_omni.edge.testing.codes import random_codes


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
