"""The benchmark harness: the speaker model is the client's ``PlaybackClock``, the table reads as Markdown, a
stamped checkpoint is kept, and a worker's options become its flags."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import BenchmarkError, ensure_checkpoint, number, run_worker, speaker, table
from vllm_omni.testing.stamps import random_weights_stamp


def test_the_speaker_stalls_from_running_dry_until_its_jitter_buffer_refills():
    # 0.2 s of audio at t=0 starts playback (until 0.2); 0.1 s at 0.5 finds it dry since 0.2 (an underrun), the
    # next 0.1 s at 0.6 fills the buffer again: 0.4 s of stall, then 0.2 s played until 0.8.
    played = speaker([(0.0, 0.2), (0.5, 0.1), (0.6, 0.1)], jitter_s=0.2)
    assert played["start"] == 0.0 and played["end"] == pytest.approx(0.8)
    assert (played["stalls"], played["stall_s"], played["longest_stall_s"]) == (
        1,
        pytest.approx(0.4),
        pytest.approx(0.4),
    )
    assert played["playing"] == [[0.0, 0.2], [0.6, pytest.approx(0.8)]]


def test_a_stream_shorter_than_the_jitter_buffer_plays_at_its_last_arrival():
    played = speaker([(1.0, 0.08), (1.5, 0.08)], jitter_s=0.2)
    assert (played["start"], played["end"], played["stalls"]) == (1.5, pytest.approx(1.66), 0)
    assert speaker([], jitter_s=0.2) == {
        "start": None, "end": None, "playing": [], "stall_s": 0.0, "stalls": 0, "longest_stall_s": 0.0,
    }  # fmt: skip


def test_the_table_is_markdown_with_the_name_column_left_and_none_as_a_dash():
    text = table(("row", "RTF", "SNR dB"), [("eager", number(0.1234, 3), None), ("plan", "0.050", 110.5)])
    assert text == "| row | RTF | SNR dB |\n| --- | ---: | ---: |\n| eager | 0.123 | - |\n| plan | 0.050 | 110.5 |"
    assert table(("a", "b"), [], align="rl").splitlines()[1] == "| ---: | --- |"
    with pytest.raises(ValueError, match="a row of 1 cells under 2 headers"):
        table(("a", "b"), [("x",)])


def test_a_checkpoint_stamped_as_asked_is_kept_and_another_talker_is_not(tmp_path, monkeypatch):
    (tmp_path / "speech_tokenizer").mkdir()
    stamp = random_weights_stamp("small", 0)  # the test kit's rule: one for the harness and the tests
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps({"random_weights": stamp}))
    (tmp_path / "speech_tokenizer" / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"random_weights": {"talker_geometry": "tiny"}}))
    (tmp_path / "model.safetensors").write_bytes(b"")

    def refuse(*args, **kwargs):
        raise AssertionError("a kept checkpoint was written again")

    monkeypatch.setattr("benchmarks.harness.checkpoints.ProcessPoolExecutor", refuse)
    assert ensure_checkpoint(tmp_path, "small") == tmp_path
    assert ensure_checkpoint(tmp_path, "small", talker="tiny") == tmp_path
    for asked in (
        {"geometry": "released"},
        {"geometry": "small", "talker": "0.6b"},
        {"seed": 1},
        {"drive": "moderate"},
    ):
        with pytest.raises(AssertionError, match="written again"):
            ensure_checkpoint(tmp_path, **{"geometry": "small", **asked})


def test_a_worker_that_fails_is_an_error_naming_its_command_with_the_options_as_flags():
    with pytest.raises(BenchmarkError) as failed:
        run_worker("benchmarks.harness", model="m", codes="c", audio_out="a", sizes=[1, 2], flag=True, skipped=None)
    message = str(failed.value)
    assert "worker -m benchmarks.harness --model m --codes c --audio-out a --sizes 1 2 --flag failed" in message
    assert "--skipped" not in message and "unrecognized arguments" in message
