"""``codec_stream record`` with hostile input (issue 12): no silent truncation, no bad counts, no lost input."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni.edge.cli.codec_stream import main as codec_stream_main
from vllm_omni.edge.stream import InvalidFramesError
from vllm_omni.testing.codes import random_codes


@pytest.fixture
def codes(tmp_path):
    path = tmp_path / "codes.npy"
    np.save(path, random_codes(10, 16, 2048, seed=2)[0].T.numpy().copy())
    return path


def record(cpu_plan, codes, out, *extra):
    return codec_stream_main(["record", "--codes", str(codes), "--plan", str(cpu_plan), "--out", str(out), *extra])


def test_float_codes_are_refused_not_truncated(cpu_plan, tmp_path, capsys):
    path = tmp_path / "float.npy"
    np.save(path, np.full((5, 16), 2020.7))
    assert record(cpu_plan, path, tmp_path / "r.qcs") == 1
    assert "codes must be whole numbers, found 2020.7" in capsys.readouterr().err
    assert not (tmp_path / "r.qcs").exists()


def test_the_encoder_refuses_fractional_and_non_numeric_codes_with_a_stream_error(cpu_plan):
    from vllm_omni.edge.plan import ExecPlan
    from vllm_omni.edge.stream import CodecStreamEncoder, StreamStart

    encoder = CodecStreamEncoder(StreamStart.for_plan(ExecPlan.load(cpu_plan, check_sha256=False)))
    with pytest.raises(InvalidFramesError, match="must be whole numbers, found 3.5"):
        encoder.frames(np.full((2, 16), 3.5))
    with pytest.raises(InvalidFramesError, match="must be whole numbers, found nan"):
        encoder.frames(np.full((2, 16), np.nan))
    with pytest.raises(InvalidFramesError, match="must be integers, found dtype <U1"):
        encoder.frames(np.full((2, 16), "1"))
    assert encoder.frames(np.full((2, 16), 3.0)) == CodecStreamEncoder(encoder.contract).frames(np.full((2, 16), 3))


@pytest.mark.parametrize("size, message", [("-4", ">= 1"), ("0", ">= 1"), ("x", ">= 1"), ("100000", "at most 256")])
def test_bad_frames_per_message_are_usage_errors(cpu_plan, codes, tmp_path, capsys, size, message):
    try:
        code = record(cpu_plan, codes, tmp_path / "r.qcs", "--frames-per-message", size)
    except SystemExit as exit_info:  # argparse's usage error
        code = exit_info.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.qcs").exists()


def test_record_never_writes_over_its_input_or_a_foreign_file(cpu_plan, codes, tmp_path, capsys):
    before = codes.read_bytes()
    assert record(cpu_plan, codes, codes) == 2 and "is an input of this run" in capsys.readouterr().err
    assert codes.read_bytes() == before
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert record(cpu_plan, codes, notes) == 2 and "pass --force" in capsys.readouterr().err
    assert notes.read_text() == "mine"
    assert record(cpu_plan, codes, notes, "--force") == 0
    assert record(cpu_plan, codes, notes) == 0  # a recording now: replacing it is what --out asks for


def test_an_unreadable_codes_file_is_one_error_line(cpu_plan, tmp_path, capsys):
    for content in (b"", b"not numpy"):
        (tmp_path / "bad.npy").write_bytes(content)
        assert record(cpu_plan, tmp_path / "bad.npy", tmp_path / "r.qcs") == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ")


def test_an_out_under_a_file_is_a_usage_error_and_a_missing_directory_is_made(cpu_plan, codes, tmp_path, capsys):
    """Issue 26: ``--out FILE/sub`` was found only when writing, after the plan and codes were read."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert record(cpu_plan, codes, notes / "r.qcs") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{notes} is a file, not a directory" in err[0], err
    assert notes.read_text() == "mine"
    assert record(cpu_plan, codes, tmp_path / "new" / "dir" / "r.qcs") == 0
    assert (tmp_path / "new" / "dir" / "r.qcs").is_file()
