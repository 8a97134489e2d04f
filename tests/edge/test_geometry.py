"""CodecGeometry: the four numbers every layer compares, read from any record that carries them."""

import pytest

from vllm_omni.edge.geometry import CodecGeometry
from vllm_omni.edge.stream import StreamStart

RELEASED = CodecGeometry(sample_rate=24000, samples_per_frame=1920, num_quantizers=16, codebook_size=2048)


def test_the_released_geometry_runs_at_12_5_frames_per_second():
    assert RELEASED.frame_rate == 12.5


def test_json_round_trip_reads_only_the_four_fields():
    row = {**RELEASED.to_json(), "hardware_class": "cpu_x86_64", "plan_id": "0" * 64}
    assert CodecGeometry.from_json(row) == RELEASED
    with pytest.raises(KeyError, match="codebook_size"):
        CodecGeometry.from_json({"sample_rate": 24000, "samples_per_frame": 1920, "num_quantizers": 16})


def test_mismatches_name_each_differing_field_with_both_values():
    other = CodecGeometry(sample_rate=24000, samples_per_frame=48, num_quantizers=16, codebook_size=512)
    assert RELEASED.mismatches(other) == {"samples_per_frame": (1920, 48), "codebook_size": (2048, 512)}
    assert RELEASED.mismatches(RELEASED) == {}


def test_mismatches_compare_a_start_message_on_the_fields_it_has():
    start = StreamStart(num_quantizers=8, codebook_size=2048, frame_rate=12.5, sample_rate=16000)
    names = ("num_quantizers", "codebook_size", "sample_rate")
    assert RELEASED.mismatches(start, names) == {"num_quantizers": (16, 8), "sample_rate": (24000, 16000)}
