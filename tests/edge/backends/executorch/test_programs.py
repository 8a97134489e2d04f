"""ExecuTorch/XNNPACK ``.pte`` windows: lowered, run in the ExecuTorch runtime, self-describing, exact at the start."""

from __future__ import annotations

import os
import shutil

import numpy as np
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.backends.executorch.run import load_pte
from vllm_omni.edge.cli.export import main as export_main
from vllm_omni.edge.plan.manifest import WindowedManifest
from vllm_omni.edge.runtime.manifest_decoder import open_windowed_decoder
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.reference import eager_windowed_decoder


def test_every_program_ran_in_the_executorch_runtime_and_matched_eager(pte_programs):
    manifest = WindowedManifest.read(pte_programs)
    assert (manifest.backend, manifest.partitioner) == ("executorch", "xnnpack")
    assert [p.name for p in manifest.programs] == ["window_c0_n2", "window_c2_n2"]
    for entry in manifest.programs:
        assert entry.path.endswith(".pte")
        assert entry.check["runtime"] == "executorch"
        assert entry.check["max_abs_diff"] < 1e-5 and entry.check["snr_db"] > 90
        assert entry.ops["delegated"] > 0 and entry.ops["delegate_subgraphs"] >= 1


def test_a_pte_describes_itself(pte_programs, small_decoder):
    manifest = WindowedManifest.read(pte_programs)
    entry = manifest.programs[1]
    _, metadata = load_pte(pte_programs / entry.path)
    assert metadata == {
        "chunk_frames": 2,
        "codebook_size": small_decoder.config.codebook_size,
        "context_frames": 2,
        "num_quantizers": 16,
        "sample_rate": 24000,
        "samples_per_frame": small_decoder.total_upsample,
        "schema_version": 1,
        "window_frames": 4,
    }


def test_a_stream_through_pte_programs_starts_exactly_like_the_full_decode(pte_programs, small_decoder):
    config = small_decoder.config
    frames = random_codes(21, config.num_quantizers, config.codebook_size, seed=9)[0].T.numpy().copy()
    decoder = open_windowed_decoder(pte_programs)
    audio = np.concatenate([decoder.feed(frames[:3]), decoder.feed(frames[3:]), decoder.flush()])
    with torch.no_grad():
        full = small_decoder(torch.from_numpy(frames.T[None].copy())).numpy().ravel()
    exact = 4 * small_decoder.total_upsample  # windows 0+2 and 2+2 hold the whole stream
    assert audio.shape == full.shape
    assert snr_db(full[:exact], audio[:exact]) > 90
    eager = eager_windowed_decoder(small_decoder, (2,), 2)
    expected = np.concatenate([eager.feed(frames), eager.flush()])
    assert np.abs(audio - expected).max() < 1e-5  # every later chunk is the eager window's audio


def test_a_program_over_tolerance_fails_the_export_and_is_removed(
    pte_programs, small_checkpoint, tmp_path, capsys, edge_args
):
    out = shutil.copytree(pte_programs, tmp_path / "strict")
    code = export_main(
        ["--model", str(small_checkpoint), "--out-dir", str(out), *edge_args["pte"], "--tolerance", "1e-12"]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1 and "over the tolerance 1e-12" in err[0]
    assert not (out / "window_c0_n2.pte").exists() and not (out / "manifest.json").exists()


def test_native_cpuinfo_lines_are_held_back_and_other_native_lines_pass(capfd):
    from vllm_omni.edge.backends.executorch.program import CPUINFO_NOISE, native_stderr_without

    with native_stderr_without(CPUINFO_NOISE):
        os.write(2, b"Error in cpuinfo: failed to parse the list of possible processors\n")
        os.write(2, b"Failed to open midr file /sys/devices/system/cpu/cpu0/regs/identification/midr_el1\n")
        os.write(2, b"E 00:00:00.000 executorch: a real native error\n")
    assert capfd.readouterr().err == "E 00:00:00.000 executorch: a real native error\n"
