"""Fixtures for the JavaScript edge modules' Node tests (web/edge/test/), made by the Python implementation.

``python tests/web/make_fixtures.py OUT_DIR`` writes, under ``OUT_DIR``:

- ``stream/golden.json`` + ``stream/*.qcs``: recordings from the Python encoder and the events the Python
  parser reads from each (start/done as their ``to_json()``, frames as ``{seq, first_frame, flags, frames}``);
- ``stream/hostile.json``: hostile, truncated and fuzzed inputs (recordings, or message sequences as a
  WebSocket carries them) with the events before the failure, the error class and its message, as the
  Python parser produces them;
- ``decode/plan/``: a small-geometry browser plan (one dynamic-B ONNX step graph in the webgpu layout, int32
  codes; first B=2, main B=4);
- ``decode/cases.json`` + raw files: seeded code sequences (int32 LE, frame-major), the torch full decode of
  each (float32 LE) and the Python ``StatefulDecoder`` decode through native onnxruntime; RoPE angles of
  ``rope_angles`` at several positions (float32 LE, compared bit for bit).

Then ``EDGE_WEB_FIXTURES=OUT_DIR node --test web/edge/test/``.
"""

from __future__ import annotations

import argparse
import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from vllm_omni.edge.stream import (
    HEADER,
    KIND_BINARY,
    KIND_JSON,
    RECORDING_MAGIC,
    CodecStreamEncoder,
    CodecStreamError,
    CodecStreamParser,
    FrameBatch,
    StreamDone,
    StreamStart,
    encode_recording,
    iter_events,
    pack11,
    record,
)
from vllm_omni.testing.streams import mutate

TINY = StreamStart(num_quantizers=2, codebook_size=2048, frame_rate=12.5, sample_rate=24000, max_frames_per_message=4)
SEED = 29


# -- events as JSON ----------------------------------------------------------------------------------


def event_json(event: StreamStart | FrameBatch | StreamDone) -> dict[str, Any]:
    if isinstance(event, FrameBatch):
        return {
            "type": "frames",
            "seq": event.seq,
            "first_frame": event.first_frame,
            "flags": event.flags,
            "frames": event.frames.tolist(),
        }
    return event.to_json()


def recording_outcome(data: bytes, max_message_bytes: int | None = None) -> dict[str, Any]:
    """What Python's ``iter_events`` makes of ``data``: the events, then the error (or none)."""
    parser = CodecStreamParser(max_message_bytes) if max_message_bytes else CodecStreamParser()
    events: list[dict[str, Any]] = []
    try:
        for event in iter_events(io.BytesIO(data), parser):
            events.append(event_json(event))
    except CodecStreamError as exc:
        return {"events": events, "error": type(exc).__name__, "message": str(exc)}
    return {"events": events, "error": None, "message": None}


def messages_outcome(messages: list[tuple[bytes, bytes]], max_message_bytes: int | None = None) -> dict[str, Any]:
    """What Python's ``CodecStreamParser.parse`` makes of the messages in turn, up to the first error."""
    parser = CodecStreamParser(max_message_bytes) if max_message_bytes else CodecStreamParser()
    events: list[dict[str, Any]] = []
    for kind, payload in messages:
        try:
            events.append(event_json(parser.parse(kind, payload)))
        except CodecStreamError as exc:
            return {"events": events, "error": type(exc).__name__, "message": str(exc)}
    return {"events": events, "error": None, "message": None}


# -- golden recordings -------------------------------------------------------------------------------


def golden_streams(rng: np.random.Generator) -> dict[str, bytes]:
    full = StreamStart(
        num_quantizers=16, codebook_size=2048, frame_rate=12.5, sample_rate=24000, max_frames_per_message=4,
        hardware_class="browser", plan_id="ab" * 32, stream_id="golden-1",
    )  # fmt: skip
    frames = rng.integers(0, 2048, size=(21, 16))
    tiny = rng.integers(0, 2048, size=(10, 2))
    tiny[0] = 2047
    int16 = StreamStart(**{**TINY.__dict__, "packing": "int16", "codebook_size": 32768, "max_frames_per_message": 3})
    carried = StreamStart(**{**TINY.__dict__, "plan": {"schema_version": 2, "nested": {"x": [1, 2.5, None]}}})
    return {
        "tiny_flags": encode_recording(
            TINY,
            [(tiny[:4], {}), (tiny[4:6], {"segment_end": True}), (tiny[6:], {"reset": True, "end_of_stream": True})],
        ),
        "full_geometry": encode_recording(
            full,
            [(frames[:1], {})]
            + [(frames[i : i + 4], {}) for i in range(1, 17, 4)]
            + [(frames[17:], {"segment_end": True}), (frames[:0], {"end_of_stream": True})],
        ),
        "int16_reset": encode_recording(
            int16,
            [(rng.integers(0, 32768, size=(3, 2)), {}), (rng.integers(0, 32768, size=(2, 2)), {"reset": True})],
            done={"reason": "cancelled"},
        ),
        "plan_carried_error_done": encode_recording(
            carried, [(tiny[:2], {})], done={"reason": "error", "error": "the engine failed: out of memory"}
        ),
        "empty_stream": encode_recording(TINY, []),
    }


# -- hostile inputs ----------------------------------------------------------------------------------


def start_bytes(start: StreamStart = TINY, **changes: Any) -> bytes:
    row = {**start.to_json(), **changes}
    return json.dumps({key: value for key, value in row.items() if value is not ...}).encode()


def hostile_cases(golden: dict[str, bytes]) -> list[dict[str, Any]]:
    J, B = KIND_JSON, KIND_BINARY
    encoder = CodecStreamEncoder(TINY)
    one, two, three = (encoder.frames(np.full((1, 2), i)) for i in range(3))
    ending = encoder.frames(np.zeros((1, 2), dtype=int), end_of_stream=True)
    after = encoder.frames(np.zeros((1, 2), dtype=int))
    pair = CodecStreamEncoder(TINY).frames(np.ones((2, 2), dtype=int))
    start = start_bytes()
    narrow = StreamStart(num_quantizers=2, codebook_size=1000, frame_rate=12.5, sample_rate=24000)
    narrow16 = StreamStart(**{**narrow.__dict__, "packing": "int16"})

    def done(**row: Any) -> str:
        return json.dumps({"type": "done", "total_frames": 0, "last_seq": None, "reason": "complete", **row})

    messages: dict[str, list[tuple[bytes, bytes]]] = {
        "frames_before_start": [(B, one)],
        "json_type_hello": [(J, b'{"type": "hello"}')],
        "json_not_utf8": [(J, b"\xff{")],
        "json_not_json": [(J, b"{'type': 'start'}")],
        "json_extra_data": [(J, start + b" x")],
        "json_list": [(J, b"[1, 2]")],
        "json_int": [(J, b"5")],
        "json_float": [(J, b"5.0")],
        "json_string": [(J, b'"start"')],
        "json_null": [(J, b"null")],
        "json_type_float": [(J, b'{"type": 1.5}')],
        "json_deep": [(J, b"[" * 5000 + b"]" * 5000)],
        "json_deep_in_plan_ok": [(J, start_bytes(plan={"a": json.loads("[" * 50 + "]" * 50)}))],
        "json_bom_bytes_ok": [(J, b"\xef\xbb\xbf" + start)],
        "json_nan_unknown_field_ok": [(J, start[:-1] + b', "extra": NaN}')],
        "json_control_char": [(J, start[:-1] + b', "stream_id": "a\x01b"}')],
        "json_escapes_ok": [(J, start_bytes(stream_id="\u00e9\\\"'\n\ud83d\ude00"))],
        "start_version_2": [(J, start_bytes(version=2))],
        "start_version_string": [(J, start_bytes(version="1"))],
        "start_version_float_ok": [(J, start_bytes(version=1.0))],
        "start_version_true_ok": [(J, start_bytes(version=True))],
        "start_version_missing": [(J, start_bytes(version=...))],
        "start_protocol_wrong": [(J, start_bytes(protocol="other"))],
        "start_protocol_missing": [(J, start_bytes(protocol=...))],
        "start_quantizers_missing": [(J, start_bytes(num_quantizers=...))],
        "start_quantizers_float": [(J, start_bytes(num_quantizers=16.0))],
        "start_quantizers_bool": [(J, start_bytes(num_quantizers=True))],
        "start_quantizers_zero": [(J, start_bytes(num_quantizers=0))],
        "start_quantizers_65": [(J, start_bytes(num_quantizers=65))],
        "start_quantizers_nan": [(J, start[:-1].replace(b'"num_quantizers": 2', b'"num_quantizers": NaN') + b"}")],
        "start_codebook_1": [(J, start_bytes(codebook_size=1))],
        "start_codebook_string": [(J, start_bytes(codebook_size="2048"))],
        "start_packed_over_2048": [(J, start_bytes(codebook_size=4096))],
        "start_int16_32768_ok": [(J, start_bytes(codebook_size=32768, packing="int16"))],
        "start_packing_zip": [(J, start_bytes(packing="zip"))],
        "start_packing_quote": [(J, start_bytes(packing="it's"))],
        "start_max_frames_0": [(J, start_bytes(max_frames_per_message=0))],
        "start_max_frames_5000": [(J, start_bytes(max_frames_per_message=5000))],
        "start_frame_rate_0": [(J, start_bytes(frame_rate=0))],
        "start_frame_rate_negative": [(J, start_bytes(frame_rate=-1.5))],
        "start_frame_rate_tiny": [(J, start_bytes(frame_rate=-1e-07))],
        "start_frame_rate_string": [(J, start_bytes(frame_rate="12.5"))],
        "start_frame_rate_infinity": [(J, start[:-1].replace(b'"frame_rate": 12.5', b'"frame_rate": Infinity') + b"}")],
        "start_frame_rate_int_ok": [(J, start_bytes(frame_rate=12))],
        "start_sample_rate_0": [(J, start_bytes(sample_rate=0))],
        "start_plan_list": [(J, start_bytes(plan=[1, 2]))],
        "start_stream_id_int": [(J, start_bytes(stream_id=7))],
        "start_stream_id_long": [(J, start_bytes(stream_id=["x" * 30, 1.5, None, True, {"k": 2}]))],
        "start_hardware_null_ok": [(J, start_bytes(hardware_class=None))],
        "start_second": [(J, start), (J, start)],
        "done_before_start": [(J, done().encode())],
        "done_second": [(J, start), (J, done().encode()), (J, done().encode())],
        "done_reason_bogus": [(J, start), (J, done(reason="bogus").encode())],
        "done_reason_missing": [(J, start), (J, b'{"type": "done", "total_frames": 0}')],
        "done_total_float": [(J, start), (J, done(total_frames=0.0).encode())],
        "done_total_bool": [(J, start), (J, done(total_frames=False).encode())],
        "done_last_seq_string": [(J, start), (J, done(last_seq="3").encode())],
        "done_error_int": [(J, start), (J, done(reason="error", error=5).encode())],
        "done_gap": [(J, start), (B, one), (J, done(total_frames=9, last_seq=0).encode())],
        "done_cancelled_any_total_ok": [(J, start), (B, one), (J, done(total_frames=9, reason="cancelled").encode())],
        "frames_version_9": [(J, start), (B, bytes([9]) + one[1:])],
        "frames_unknown_flag": [(J, start), (B, one[:1] + bytes([0x08]) + one[2:])],
        "frames_truncated": [(J, start), (B, pair[:-1])],
        "frames_header_only_part": [(J, start), (B, pair[:5])],
        "frames_empty": [(J, start), (B, b"")],
        "frames_oversized": [(J, start), (B, pair + b"\0")],
        "frames_too_many": [(J, start), (B, HEADER.pack(1, 0, 5, 0, 0) + bytes(14))],
        "frames_zero_no_flag": [(J, start), (B, HEADER.pack(1, 0, 0, 0, 0))],
        "frames_zero_with_flag_ok": [(J, start), (B, HEADER.pack(1, 2, 0, 0, 0))],
        "frames_code_out_of_range": [
            (J, start_bytes(narrow)),
            (B, HEADER.pack(1, 0, 1, 0, 0) + pack11(np.array([5, 1500]))),
        ],
        "frames_code_negative_int16": [
            (J, start_bytes(narrow16)),
            (B, HEADER.pack(1, 0, 1, 0, 0) + np.array([-3, 4], dtype="<i2").tobytes()),
        ],
        "frames_duplicate": [(J, start), (B, one), (B, one)],
        "frames_gap_seq": [(J, start), (B, one), (B, three)],
        "frames_gap_first_frame": [(J, start), (B, one), (B, two[:8] + (5).to_bytes(4, "little") + two[12:])],
        "frames_after_end": [(J, start), (B, one), (B, two), (B, three), (B, ending), (B, after)],
        "frames_after_done": [(J, start), (B, one), (J, done(total_frames=1, last_seq=0).encode()), (B, two)],
        "unknown_kind": [(b"X", b"{}")],
    }
    cases = [
        {"name": name, "transport": "messages", "messages": [[k.decode(), p.hex()] for k, p in rows]}
        for name, rows in messages.items()
    ]
    small_limit = [(J, start), (J, b" " * 65 + done().encode())]
    cases.append({"name": "json_over_limit", "transport": "messages", "max_message_bytes": 64,
                  "messages": [[k.decode(), p.hex()] for k, p in small_limit]})  # fmt: skip

    recordings: dict[str, bytes] = {
        "empty": b"",
        "magic_cut": RECORDING_MAGIC[:2],
        "magic_wrong": b"RIFF" + golden["tiny_flags"][4:],
        "magic_quote": b"'\"\\\x00" + golden["tiny_flags"][4:],
        "kind_wrong": RECORDING_MAGIC + b"X" + (2).to_bytes(4, "little") + b"{}",
        "length_huge": RECORDING_MAGIC + b"B" + (1 << 30).to_bytes(4, "little"),
        "no_done": RECORDING_MAGIC + record(J, start) + record(B, one),
        "duplicate": RECORDING_MAGIC + record(J, start) + record(B, one) + record(B, one),
        "trailing_garbage_after_done_ok": golden["tiny_flags"] + b"garbage that is never read",
    }
    tiny = golden["tiny_flags"]
    for cut in range(len(tiny)):  # every cut of a recording: a truncated stream, wherever it falls
        recordings[f"cut_{cut:03d}"] = tiny[:cut]
    rng = random.Random(SEED)
    for index in range(400):
        source = golden["tiny_flags"] if index % 2 else golden["int16_reset"]
        recordings[f"fuzz_{index:03d}"] = mutate(source, rng)
    for index in range(100):
        recordings[f"random_{index:03d}"] = RECORDING_MAGIC + rng.randbytes(rng.randint(0, 64))
    cases += [{"name": name, "transport": "recording", "data": data.hex()} for name, data in recordings.items()]
    for index in range(200):  # bare messages after a valid start, as a WebSocket would deliver them
        kind = rng.choice([J, B])
        rows = [(J, start), (kind, mutate(golden["tiny_flags"][40:80], rng))]
        cases.append({"name": f"fuzz_message_{index:03d}", "transport": "messages",
                      "messages": [[k.decode(), p.hex()] for k, p in rows]})  # fmt: skip

    for case in cases:
        limit = case.get("max_message_bytes")
        if case["transport"] == "recording":
            case.update(recording_outcome(bytes.fromhex(case["data"]), limit))
        else:
            rows = [(k.encode(), bytes.fromhex(p)) for k, p in case["messages"]]
            case.update(messages_outcome(rows, limit))
        if case["name"].endswith("_ok") and case["error"] is not None:
            raise AssertionError(f"{case['name']} should parse in Python: {case['error']}: {case['message']}")
    return cases


# -- decoding ----------------------------------------------------------------------------------------


def write_decode_fixtures(out: Path, checkpoint: Path | None, hardware: str) -> None:
    import torch

    from vllm_omni.edge.backends.onnx.run import OnnxStepGraph
    from vllm_omni.edge.builders.registry import build
    from vllm_omni.edge.builders.request import BuildRequest
    from vllm_omni.edge.checkpoint import load_code2wav_decoder
    from vllm_omni.edge.hardware import get_hardware_class
    from vllm_omni.edge.runtime.stateful_decoder import StatefulDecoder, rope_angles
    from vllm_omni.testing.make_checkpoint import write_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    if checkpoint is None:
        checkpoint = write_checkpoint(out / "checkpoint", "small", seed=0)
    request = BuildRequest(
        model=str(checkpoint), out_dir=out / "plan", step_frames=4, first_step_frames=2, progress=lambda line: None
    )
    plan = build(get_hardware_class(hardware), request)
    decoder = load_code2wav_decoder(checkpoint)
    graph = OnnxStepGraph(plan.path("main"))
    main = graph.runner(plan.step_contract("main").step_frames)
    first = graph.runner(plan.step_contract("first").step_frames)
    codec = plan.codec
    utterances = []
    for name, frames, seed in (("long", 41, 1), ("short", 9, 2), ("one_frame", 1, 3), ("stale", 3, 4)):
        generator = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, codec.codebook_size, (1, codec.num_quantizers, frames), generator=generator)
        with torch.inference_mode():
            full = decoder(codes)[0, 0].numpy().astype("<f4")
        frame_major = codes[0].T.numpy().astype("<i4")
        stream = StatefulDecoder(main, first)
        stepwise = np.concatenate([stream.feed(frame_major[:5]), stream.feed(frame_major[5:]), stream.flush()])
        (out / f"{name}.codes.i32").write_bytes(frame_major.tobytes())
        (out / f"{name}.full.f32").write_bytes(full.tobytes())
        (out / f"{name}.stepwise.f32").write_bytes(stepwise.astype("<f4").tobytes())
        utterances.append({"name": name, "frames": frames, "samples": int(full.size)})
    inv_freq = np.asarray(plan.step_contract("main").rope_inv_freq, dtype=np.float32)
    rope = []
    for start, count in ((0, 4), (71, 3), (1000, 2), (123457, 4), (16777215, 2)):
        (out / f"rope_{start}.f32").write_bytes(rope_angles(start, count, inv_freq).astype("<f4").tobytes())
        rope.append({"start": start, "count": count, "file": f"rope_{start}.f32"})
    cases = {"plan_dir": "plan", "hardware_class": hardware, "utterances": utterances, "rope": rope}
    (out / "cases.json").write_text(json.dumps(cases, indent=1))


def write_fixtures(out: Path, checkpoint: Path | None = None, hardware: str = "browser") -> Path:
    stream_dir = out / "stream"
    stream_dir.mkdir(parents=True, exist_ok=True)
    golden = golden_streams(np.random.default_rng(SEED))
    rows = []
    for name, data in golden.items():
        (stream_dir / f"{name}.qcs").write_bytes(data)
        outcome = recording_outcome(data)
        if outcome["error"] is not None:
            raise AssertionError(f"golden recording {name} does not parse in Python: {outcome['message']}")
        rows.append({"name": name, "file": f"{name}.qcs", "events": outcome["events"]})
    (stream_dir / "golden.json").write_text(json.dumps(rows, indent=1))
    (stream_dir / "hostile.json").write_text(json.dumps(hostile_cases(golden)))
    write_decode_fixtures(out / "decode", checkpoint, hardware)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the fixtures into")
    parser.add_argument("--checkpoint", type=Path, help="a small-geometry checkpoint to use (default: write one)")
    parser.add_argument("--hardware", default="browser", help="the hardware class whose plan to build")
    args = parser.parse_args(argv)
    write_fixtures(args.out, args.checkpoint, args.hardware)
    print(f"wrote fixtures to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
