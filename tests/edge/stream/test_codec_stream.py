"""The codec-token wire protocol: pinned bytes, round trips, typed errors, and a fuzzer that must not crash."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni.edge.stream import (
    HEADER,
    KIND_BINARY,
    KIND_JSON,
    RECORDING_MAGIC,
    BadVersionError,
    CodecStreamEncoder,
    CodecStreamError,
    CodecStreamParser,
    CodesOutOfRangeError,
    DuplicateMessageError,
    FrameBatch,
    FramesAfterEndError,
    MalformedMessageError,
    OversizedMessageError,
    SequenceGapError,
    StreamDone,
    StreamStart,
    TooManyFramesError,
    TruncatedMessageError,
    TruncatedStreamError,
    encode_recording,
    iter_events,
    pack11,
    record,
    unpack11,
)
from vllm_omni.testing.streams import mutate

TINY = StreamStart(num_quantizers=2, codebook_size=2048, frame_rate=12.5, sample_rate=24000, max_frames_per_message=4)


def started(start: StreamStart = TINY) -> CodecStreamParser:
    parser = CodecStreamParser()
    parser.parse_json(CodecStreamEncoder(start).start())
    return parser


# -- the format, pinned byte for byte -------------------------------------------------------------


def test_a_frames_message_is_pinned_byte_for_byte_in_both_packings():
    frames = np.array([[1, 2047]])
    packed = CodecStreamEncoder(TINY).frames(frames)
    assert packed.hex() == "01000100000000000000000001f83f"
    int16 = CodecStreamEncoder(StreamStart(**{**TINY.__dict__, "packing": "int16"})).frames(frames, segment_end=True)
    assert int16.hex() == "0102010000000000000000000100ff07"


def test_the_header_counts_sequence_and_frames_and_carries_the_flags():
    encoder = CodecStreamEncoder(TINY)
    encoder.frames(np.zeros((3, 2), dtype=int))
    message = encoder.frames(np.zeros((2, 2), dtype=int), reset=True, end_of_stream=True)
    assert HEADER.unpack_from(message) == (1, 0x05, 2, 1, 3)
    assert json.loads(encoder.done()) == {
        "type": "done", "total_frames": 5, "last_seq": 1, "reason": "complete", "error": None,
    }  # fmt: skip


def test_the_start_message_and_the_recording_framing_are_pinned():
    start = json.loads(CodecStreamEncoder(TINY).start())
    assert start == {
        "type": "start", "protocol": "qwen3-tts-codec-stream", "num_quantizers": 2, "codebook_size": 2048,
        "frame_rate": 12.5, "sample_rate": 24000, "packing": "packed11", "max_frames_per_message": 4, "version": 1,
    }  # fmt: skip
    assert record(KIND_BINARY, b"xyz").hex() == "420300000078797a"
    assert encode_recording(TINY, []).startswith(RECORDING_MAGIC + b"J")


@pytest.mark.parametrize("count", [1, 7, 16, 33])
def test_pack11_round_trips_every_value(count):
    codes = np.random.default_rng(count).integers(0, 2048, size=count)
    codes[0] = 2047
    data = pack11(codes)
    assert len(data) == (11 * count + 7) // 8
    assert np.array_equal(unpack11(data, count), codes)


def test_a_recording_round_trips_frames_and_flags():
    frames = np.random.default_rng(0).integers(0, 2048, size=(10, 2))
    data = encode_recording(
        TINY,
        [(frames[:4], {}), (frames[4:6], {"segment_end": True}), (frames[6:], {"reset": True, "end_of_stream": True})],
    )
    events = list(iter_events(io.BytesIO(data)))
    assert isinstance(events[0], StreamStart) and isinstance(events[-1], StreamDone)
    batches = [e for e in events if isinstance(e, FrameBatch)]
    assert [b.first_frame for b in batches] == [0, 4, 6]
    assert [(b.segment_end, b.reset, b.end_of_stream) for b in batches] == [
        (False, False, False), (True, False, False), (False, True, True),
    ]  # fmt: skip
    assert np.array_equal(np.concatenate([b.frames for b in batches]), frames)
    assert events[-1].total_frames == 10


# -- typed errors ----------------------------------------------------------------------------------


def test_frames_before_start_and_unknown_json_are_malformed():
    parser = CodecStreamParser()
    with pytest.raises(MalformedMessageError, match="before the start message"):
        parser.parse_frames(CodecStreamEncoder(TINY).frames(np.zeros((1, 2), dtype=int)))
    with pytest.raises(MalformedMessageError, match="type 'hello'"):
        parser.parse_json(b'{"type": "hello"}')
    with pytest.raises(MalformedMessageError, match="does not parse"):
        parser.parse_json(b"\xff{")


def test_versions_this_parser_does_not_speak_are_refused():
    with pytest.raises(BadVersionError, match="version 2"):
        CodecStreamParser().parse_json(json.dumps({**TINY.to_json(), "version": 2}).encode())
    message = bytearray(CodecStreamEncoder(TINY).frames(np.zeros((1, 2), dtype=int)))
    message[0] = 9
    with pytest.raises(BadVersionError, match="version 9"):
        started().parse_frames(bytes(message))


def test_truncated_oversized_and_too_many_frames():
    message = CodecStreamEncoder(TINY).frames(np.ones((2, 2), dtype=int))
    with pytest.raises(TruncatedMessageError):
        started().parse_frames(message[:-1])
    with pytest.raises(TruncatedMessageError, match="header alone"):
        started().parse_frames(message[:5])
    with pytest.raises(OversizedMessageError):
        started().parse_frames(message + b"\0")
    huge = HEADER.pack(1, 0, 5, 0, 0) + bytes(14)
    with pytest.raises(TooManyFramesError, match="allows 4 per message"):
        started().parse_frames(huge)
    with pytest.raises(OversizedMessageError, match="limit"):
        next(iter_events(io.BytesIO(RECORDING_MAGIC + b"B" + (1 << 30).to_bytes(4, "little"))))


def test_codes_out_of_range_are_refused_with_the_code():
    start = StreamStart(num_quantizers=2, codebook_size=1000, frame_rate=12.5, sample_rate=24000)
    message = HEADER.pack(1, 0, 1, 0, 0) + pack11(np.array([5, 1500]))
    with pytest.raises(CodesOutOfRangeError, match="code 1500 is outside 0..999"):
        started(start).parse_frames(message)
    int16 = StreamStart(**{**start.__dict__, "packing": "int16"})
    with pytest.raises(CodesOutOfRangeError, match="code -3"):
        started(int16).parse_frames(HEADER.pack(1, 0, 1, 0, 0) + np.array([-3, 4], dtype="<i2").tobytes())


def test_gaps_duplicates_and_frames_after_the_end():
    encoder = CodecStreamEncoder(TINY)
    first, second, third = (encoder.frames(np.zeros((1, 2), dtype=int)) for _ in range(3))
    parser = started()
    parser.parse_frames(first)
    with pytest.raises(DuplicateMessageError):
        parser.parse_frames(first)
    with pytest.raises(SequenceGapError, match="expected 1"):
        parser.parse_frames(third)
    assert parser.next_seq == 1  # errors leave the state as it was
    parser.parse_frames(second)
    ending = encoder.frames(np.zeros((1, 2), dtype=int), end_of_stream=True)
    parser.parse_frames(third)
    parser.parse_frames(ending)
    with pytest.raises(FramesAfterEndError):
        parser.parse_frames(encoder.frames(np.zeros((1, 2), dtype=int)))
    with pytest.raises(SequenceGapError, match="done says 9 frames, 4 arrived"):
        parser.parse_json(json.dumps({"type": "done", "total_frames": 9, "last_seq": 3, "reason": "complete"}))


def test_a_cut_off_recording_is_a_truncated_stream():
    data = encode_recording(TINY, [(np.zeros((3, 2), dtype=int), {})])
    for cut in (len(data) - 3, len(data) - 30):
        with pytest.raises(TruncatedStreamError):
            list(iter_events(io.BytesIO(data[:cut])))
    with pytest.raises(MalformedMessageError, match="not a codec-stream recording"):
        list(iter_events(io.BytesIO(b"RIFF" + data[4:])))


# -- fuzzing ---------------------------------------------------------------------------------------

SAMPLE = encode_recording(
    TINY,
    [
        (np.arange(8).reshape(4, 2), {}),
        (np.full((2, 2), 2047), {"segment_end": True}),
        (np.ones((1, 2)), {"reset": True}),
    ],
)


def parse_all(data: bytes) -> str:
    """Everything a client does with bytes: ``"complete"`` or the typed protocol error's name.

    Anything else (an untyped exception, a hang) escapes and fails the test that called it.
    """
    try:
        for _ in iter_events(io.BytesIO(data)):
            pass
    except CodecStreamError as exc:
        return type(exc).__name__
    return "complete"


def run_fuzz(count: int, seed: int = 0) -> Counter:
    """Parse ``count`` inputs (mutated recordings, random bytes, bare messages after a valid start);
    count each outcome: ``complete``, ``event`` or the typed error's name."""
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    for index in range(count):
        if index % 3 == 0:
            outcomes[parse_all(RECORDING_MAGIC + rng.randbytes(rng.randint(0, 64)))] += 1
        elif index % 3 == 1:
            outcomes[parse_all(mutate(SAMPLE, rng))] += 1
        else:
            try:
                started().parse(rng.choice([KIND_BINARY, KIND_JSON]), mutate(SAMPLE[40:80], rng))
                outcomes["event"] += 1
            except CodecStreamError as exc:
                outcomes[type(exc).__name__] += 1
    return outcomes


def test_mutated_and_random_streams_give_only_typed_errors():
    count = int(os.environ.get("CODEC_STREAM_FUZZ_INPUTS", "3000"))
    outcomes = run_fuzz(count, seed=1)
    assert sum(outcomes.values()) == count  # every input ended in an event, a complete stream or a typed error
    typed = {name for name in outcomes if name.endswith("Error")}
    assert {"TruncatedStreamError", "MalformedMessageError", "BadVersionError", "SequenceGapError"} <= typed
    assert outcomes["complete"] + outcomes["event"] > 0  # some mutations still parse: not everything is refused


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_any_bytes_after_the_magic_give_an_event_or_a_typed_error(data):
    parse_all(RECORDING_MAGIC + data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from([KIND_BINARY, KIND_JSON]))
def test_any_message_after_a_valid_start_gives_an_event_or_a_typed_error(data, kind):
    with contextlib.suppress(CodecStreamError):
        started().parse(kind, data)


if __name__ == "__main__":  # the long run: python -m tests.edge.stream.test_codec_stream 100000
    import time

    begin = time.perf_counter()
    outcomes = run_fuzz(
        int(sys.argv[1]) if len(sys.argv) > 1 else 100_000, seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0
    )
    print(f"{sum(outcomes.values())} inputs parsed without a crash or hang in {time.perf_counter() - begin:.1f} s")
    print(dict(outcomes.most_common()))
