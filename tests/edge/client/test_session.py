"""The edge client: recorded and served streams decoded through each plan, resets, truncation, bad streams."""

from __future__ import annotations

import functools
import http.server
import io
import shutil
import subprocess
import sys
import threading
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni.edge.audio import float_to_pcm16, snr_db
from vllm_omni.edge.cli.client import main as client_main
from vllm_omni.edge.client import EdgeClient, fetch_plan
from vllm_omni.edge.plan import ExecPlan, ExecPlanError
from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, CodecStreamEncoder, StreamStart
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.streams import recording, segment_messages


def decode(plan: ExecPlan, data: bytes):
    pieces: list[np.ndarray] = []
    report = EdgeClient(plan).run(io.BytesIO(data), [pieces.append])
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), report


def full_decode(small_decoder, frames: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return small_decoder(torch.from_numpy(frames.T[None].copy()))[0, 0].numpy()


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as handle:
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")


@pytest.fixture(scope="module")
def cpu(cpu_plan) -> ExecPlan:
    return ExecPlan.load(cpu_plan)


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return random_codes(22, 16, 2048, seed=21)[0].T.numpy().copy()


def test_a_recorded_stream_through_the_cpu_plan_equals_the_full_decode(cpu, frames, small_decoder):
    audio, report = decode(cpu, recording(segment_messages(cpu, [frames])))
    assert snr_db(full_decode(small_decoder, frames), audio) >= 90
    assert (report.frames, report.done_reason, report.error, report.duplicates) == (22, "complete", None, 0)
    assert report.first_audio_seconds is not None and report.real_time_factor > 0


def test_a_recorded_stream_through_the_phone_plan_is_exact_while_it_fits_the_window(phone_plan, small_decoder):
    plan = ExecPlan.load(phone_plan)
    short = random_codes(4, 16, 2048, seed=22)[0].T.numpy().copy()
    audio, report = decode(plan, recording(segment_messages(plan, [short], per_message=1)))
    assert report.error is None and snr_db(full_decode(small_decoder, short), audio) >= 90


def test_a_reset_gives_exactly_the_audio_of_two_independent_streams(cpu, frames, small_decoder):
    first, second = frames[:10], frames[10:]
    together, report = decode(cpu, recording(segment_messages(cpu, [first, second])))
    apart = np.concatenate([decode(cpu, recording(segment_messages(cpu, [part])))[0] for part in (first, second)])
    assert np.array_equal(together, apart) and report.resets == 1
    assert (
        snr_db(np.concatenate([full_decode(small_decoder, first), full_decode(small_decoder, second)]), together) >= 90
    )


def test_a_reset_without_segment_end_drops_the_undecoded_frames(cpu, frames):
    """Barge-in: frames of the old utterance not yet decoded are dropped, never played after the reset."""
    encoder = CodecStreamEncoder(StreamStart.for_plan(cpu))
    items = [(KIND_JSON, encoder.start()), (KIND_BINARY, encoder.frames(frames[:6]))]  # B=4 decodes 2, then 4 more
    items += [(KIND_BINARY, encoder.frames(frames[6:9], reset=True, end_of_stream=True)), (KIND_JSON, encoder.done())]
    audio, _ = decode(cpu, recording(items))
    hop = cpu.codec.samples_per_frame
    old = decode(cpu, recording(segment_messages(cpu, [frames[:6]])))[0][: 6 * hop]
    new = decode(cpu, recording(segment_messages(cpu, [frames[6:9]])))[0]
    assert audio.size == 6 * hop + new.size  # the first two steps (first B=2, main B=4) were decoded before it
    assert np.array_equal(audio[: 6 * hop], old) and np.array_equal(audio[6 * hop :], new)


def test_duplicates_are_skipped_and_counted(cpu, frames):
    items = segment_messages(cpu, [frames])
    with_duplicate = [*items[:3], items[2], items[1], *items[3:]]
    audio, report = decode(cpu, recording(with_duplicate))
    assert report.duplicates == 2 and report.error is None
    assert np.array_equal(audio, decode(cpu, recording(items))[0])


def test_a_gap_ends_the_run_with_a_clear_error_and_keeps_the_audio_so_far(cpu, frames):
    items = segment_messages(cpu, [frames])
    audio, report = decode(cpu, recording([*items[:3], *items[4:]]))
    assert "messages were lost" in report.error and report.frames == 6
    assert audio.size == 6 * cpu.codec.samples_per_frame


def test_a_stream_for_another_plan_is_refused(cpu, frames):
    audio, report = decode(cpu, recording(segment_messages(cpu, [frames], plan_id="0" * 64)))
    assert "made for plan 000000000000" in report.error and audio.size == 0


def test_a_truncated_stream_ends_with_a_clear_error_and_the_audio_intact_on_disk(
    cpu_plan, cpu, frames, tmp_path, capsys
):
    data = recording(segment_messages(cpu, [frames]))
    (tmp_path / "whole.qcs").write_bytes(data)
    assert (
        client_main(
            ["--stream", str(tmp_path / "whole.qcs"), "--plan", str(cpu_plan), "--out", str(tmp_path / "whole.wav")]
        )
        == 0
    )
    whole = read_wav(tmp_path / "whole.wav")
    cut = data[: len(data) // 2 + 7]  # inside a frames message
    (tmp_path / "cut.qcs").write_bytes(cut)
    code = client_main(
        ["--stream", str(tmp_path / "cut.qcs"), "--plan", str(cpu_plan), "--out", str(tmp_path / "cut.wav")]
    )
    err = capsys.readouterr().err
    assert code == 1 and "error: the stream ended" in err and "cut off" in err and "cut.wav" in err
    partial = read_wav(tmp_path / "cut.wav")
    assert 0 < partial.size < whole.size and partial.size % cpu.codec.samples_per_frame == 0
    assert np.array_equal(partial, whole[: partial.size])
    assert not list(tmp_path.glob(".*partial*"))


@pytest.fixture
def server(tmp_path):
    """A static HTTP server over tmp_path/www (what the serving issue's server sends, byte for byte)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *args: None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_served_stream_and_plan_are_fetched_checked_and_decoded(cpu_plan, cpu, frames, server, tmp_path):
    root, url = server
    shutil.copytree(cpu_plan, root / "plan")
    (root / "stream.qcs").write_bytes(recording(segment_messages(cpu, [frames])))
    cache = tmp_path / "cache"
    command = ["--stream", f"{url}/stream.qcs", "--plan", f"{url}/plan", "--cache-dir", str(cache)]
    assert client_main([*command, "--out", str(tmp_path / "served.wav")]) == 0
    fetched = cache / cpu.plan_id
    assert sorted(p.name for p in fetched.iterdir()) == ["exec_plan.json", "step_b1-4.onnx"]  # one graph, both roles
    audio, _ = decode(cpu, recording(segment_messages(cpu, [frames])))
    assert np.array_equal(read_wav(tmp_path / "served.wav"), float_to_pcm16(audio))
    # A damaged artifact on the server is refused, and nothing that fails its sha256 is kept.
    shutil.rmtree(cache)
    (root / "plan" / "step_b1-4.onnx").write_bytes((root / "plan" / "step_b1-4.onnx").read_bytes()[::-1])
    with pytest.raises(ExecPlanError, match="does not hash to the plan's sha256"):
        fetch_plan(f"{url}/plan", cache)
    assert not (cache / cpu.plan_id / "step_b1-4.onnx").exists()


def test_pcm_goes_to_stdout_as_raw_s16le(cpu_plan, cpu, frames, tmp_path, repo_root):
    (tmp_path / "s.qcs").write_bytes(recording(segment_messages(cpu, [frames])))
    result = subprocess.run(
        [sys.executable, "-m", "vllm_omni.edge", "client", "--stream", "-", "--plan", str(cpu_plan), "--pcm-stdout"],
        input=(tmp_path / "s.qcs").read_bytes(),
        capture_output=True,
        cwd=repo_root,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    audio, _ = decode(cpu, recording(segment_messages(cpu, [frames])))
    assert result.stdout == float_to_pcm16(audio).tobytes()
    assert b"first audio after" in result.stderr and b"real-time factor" in result.stderr


def test_the_client_needs_somewhere_to_write(cpu_plan, capsys):
    assert client_main(["--stream", "x", "--plan", str(cpu_plan)]) == 2
    assert "nothing to write" in capsys.readouterr().err


def test_record_and_inspect_on_the_command_line(cpu_plan, cpu, frames, tmp_path, capsys):
    from vllm_omni.edge.cli.codec_stream import main as codec_stream_main

    np.save(tmp_path / "codes.npy", frames)
    command = [
        "record",
        "--codes",
        str(tmp_path / "codes.npy"),
        "--plan",
        str(cpu_plan),
        "--out",
        str(tmp_path / "r.qcs"),
    ]
    assert codec_stream_main([*command, "--frames-per-message", "5"]) == 0
    assert codec_stream_main(["inspect", str(tmp_path / "r.qcs")]) == 0
    shown = capsys.readouterr().out
    assert "22 frames in 5 messages" in shown and "frames seq=4 first=20 count=2 ['end']" in shown
    audio, report = decode(cpu, (tmp_path / "r.qcs").read_bytes())
    assert report.error is None and np.array_equal(audio, decode(cpu, recording(segment_messages(cpu, [frames])))[0])


def test_the_arm64_cpu_plan_builds_validates_and_decodes_a_recorded_stream(
    small_checkpoint, frames, small_decoder, tmp_path, edge_args, build_plan
):
    plan = ExecPlan.load(build_plan(small_checkpoint, tmp_path / "cpu_arm64", "cpu_arm64", *edge_args["step"]))
    assert (plan.hardware_class, plan.backend) == ("cpu_arm64", "onnxruntime")
    audio, report = decode(plan, recording(segment_messages(plan, [frames])))
    assert report.error is None and snr_db(full_decode(small_decoder, frames), audio) >= 90


def test_the_playback_clock_counts_underruns_behind_its_jitter_buffer():
    from vllm_omni.edge.client import PlaybackClock

    clock = PlaybackClock(jitter_seconds=0.2)
    clock.add(0.1, now=0.0)  # buffering: 0.1 s < 0.2 s
    clock.add(0.1, now=0.05)  # 0.2 s buffered: playback starts at 0.05 and lasts until 0.25
    clock.add(0.1, now=0.2)  # in time: audio now lasts until 0.35
    assert clock.underruns == 0
    clock.add(0.1, now=0.5)  # the speaker ran dry at 0.35
    assert clock.underruns == 1
    clock.add(0.1, now=0.55)  # buffering again, 0.2 s: playback restarts
    clock.add(0.3, now=0.6)
    assert clock.underruns == 1
