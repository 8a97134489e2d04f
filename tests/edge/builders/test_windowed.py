"""The windowed export CLI: programs, manifest, verification, resuming, and refusing bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.cli.export import main as export_main
from vllm_omni.edge.plan.manifest import ManifestError, WindowedManifest
from vllm_omni.edge.runtime.manifest_decoder import open_windowed_decoder
from vllm_omni.testing.codes import random_codes


def stream_frames(decoder, frames: np.ndarray) -> np.ndarray:
    pieces = [decoder.feed(frames[start : start + 3]) for start in range(0, len(frames), 3)]
    return np.concatenate([*pieces, decoder.flush()])


def test_manifest_lists_every_window_with_its_file_and_contract(pt2_programs, small_decoder):
    manifest = WindowedManifest.read(pt2_programs)
    hop = small_decoder.total_upsample
    assert [(p.context_frames, p.chunk_frames, p.window_frames) for p in manifest.programs] == [
        (0, 2, 2), (2, 4, 6), (4, 4, 8)
    ]  # fmt: skip
    assert (manifest.ramp, manifest.context_frames, manifest.codec.samples_per_frame) == ((2, 4), 4, hop)
    assert (manifest.backend, manifest.partitioner, manifest.codec.sample_rate) == ("torch_export", "none", 24000)
    assert manifest.geometry["sliding_window"] == small_decoder.config.sliding_window
    for entry in manifest.programs:
        assert entry.inputs[0].shape == (1, 16, entry.window_frames) and entry.inputs[0].dtype == "int64"
        assert entry.outputs[0].shape == (1, entry.chunk_frames * hop)
        assert entry.check["max_abs_diff"] == 0.0  # the .pt2 reloaded and run by torch is the eager graph
        manifest.verify_program(entry)  # size and sha256 match the file
    assert not list(pt2_programs.glob(".*partial*"))


def test_a_rerun_keeps_intact_programs_and_redoes_a_damaged_one(
    pt2_programs, small_checkpoint, tmp_path, capsys, edge_args, export_programs
):
    out = shutil.copytree(pt2_programs, tmp_path / "again")
    damaged = out / "window_c2_n4.pt2"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    capsys.readouterr()
    export_programs(small_checkpoint, out, *edge_args["pt2"])
    log = capsys.readouterr().err
    assert "window_c0_n2 (context 0 + chunk 2): kept window_c0_n2.pt2" in log
    assert log.count(": kept ") == 2 and "wrote window_c2_n4.pt2" in log
    WindowedManifest.read(out).verify_program(WindowedManifest.read(out).programs[1])


def test_stream_through_pt2_programs_matches_the_full_decode_at_the_start(pt2_programs, small_decoder):
    config = small_decoder.config
    frames = random_codes(20, config.num_quantizers, config.codebook_size, seed=5)[0].T.numpy().copy()
    audio = stream_frames(open_windowed_decoder(pt2_programs), frames)
    with torch.no_grad():
        reference = small_decoder(torch.from_numpy(frames.T[None].copy())).numpy().ravel()
    exact = 6 * small_decoder.total_upsample  # windows 0+2 and 2+4 hold the whole stream
    assert audio.shape == reference.shape
    assert snr_db(reference[:exact], audio[:exact]) > 90


def test_a_corrupt_or_swapped_program_is_refused_before_the_runtime_sees_it(pt2_programs, tmp_path):
    out = shutil.copytree(pt2_programs, tmp_path / "bad")
    program = out / "window_c0_n2.pt2"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="sha256 .* does not match"):
        open_windowed_decoder(out)

    # A program from another window, with the manifest edited to its size and digest: its own metadata tells.
    shutil.copy(out / "window_c2_n4.pt2", program)
    payload = json.loads((out / "manifest.json").read_text())
    payload["programs"][0].update(payload["programs"][1], name="window_c0_n2", context_frames=0, chunk_frames=2)
    payload["programs"][0]["path"] = "window_c0_n2.pt2"
    (out / "manifest.json").write_text(json.dumps(payload))
    with pytest.raises(ManifestError, match="context_frames: expected 0, program says 2"):
        open_windowed_decoder(out)


def test_a_manifest_of_another_schema_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(ManifestError, match="expected schema"):
        WindowedManifest.read(tmp_path)
    with pytest.raises(ManifestError, match="no manifest"):
        WindowedManifest.read(tmp_path / "missing")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ramp", "4", "2"], "strictly increasing"),
        (["--context", "-1"], "context must be"),
        (["--backend", "tflite"], "unknown backend 'tflite'; known: torch_export, executorch"),
        (
            ["--backend", "executorch", "--partitioner", "qnn"],
            "unknown partitioner 'qnn'; known: xnnpack, coreml, none",
        ),
        (["--backend", "executorch", "--partitioner", "coreml"], "needs coremltools with Apple's CoreML"),
        (["--backend", "torch_export", "--partitioner", "xnnpack"], "applies to --backend executorch"),
        (["--dtype", "int4"], "unknown dtype"),
    ],
)
def test_bad_arguments_give_one_line_and_leave_nothing(small_checkpoint, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = export_main(["--model", str(small_checkpoint), "--out-dir", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out.exists()


def test_a_model_dir_without_speech_tokenizer_is_one_clear_line(tmp_path, capsys):
    model = tmp_path / "not_a_checkpoint"
    model.mkdir()
    code = export_main(["--model", str(model), "--out-dir", str(tmp_path / "out"), "--backend", "torch_export"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "speech_tokenizer" in err[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_empty_ramp_is_an_argument_error(small_checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        export_main(["--model", str(small_checkpoint), "--out-dir", str(tmp_path), "--ramp"])
    assert exit_info.value.code == 2 and "--ramp" in capsys.readouterr().err
