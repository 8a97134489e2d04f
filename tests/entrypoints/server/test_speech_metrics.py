"""The speech feature's own metrics: what one utterance records (first frame, first audio, frames and the speech
they hold), in Prometheus' text format under ``vllm_omni_speech_*``. Served: ``test_serve.py``."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from vllm_omni.entrypoints.server.speech_metrics import BUCKETS_S, Meter, SpeechMetrics

pytestmark = pytest.mark.vllm  # prometheus_client: the serving venv's


def exposition(registry) -> dict[str, float]:
    from prometheus_client import generate_latest

    rows = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            rows[name] = float(value)
    return rows


def test_an_utterance_records_its_first_frame_first_audio_and_the_speech_sent():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = SpeechMetrics(registry)
    meter = Meter("speech", "whole", seconds_per_frame=0.08, metrics=metrics)

    async def talker():
        await asyncio.sleep(0.03)
        yield np.zeros((0, 16), dtype=np.int64)  # a held talker's empty batch is not a first frame
        yield np.zeros((2, 16), dtype=np.int64)
        yield np.zeros((3, 16), dtype=np.int64)

    async def speak() -> int:
        count = 0
        async for batch in meter.frames(talker()):
            meter.sent(len(batch))
            count += len(batch)
        return count

    began = time.monotonic()
    assert asyncio.run(speak()) == 5
    took = time.monotonic() - began
    rows = exposition(registry)
    first = 'vllm_omni_speech_first_frame_seconds_sum{route="speech",text_mode="whole"}'
    assert 0.03 <= rows[first] <= took
    assert rows['vllm_omni_speech_first_frame_seconds_count{route="speech",text_mode="whole"}'] == 1
    assert rows['vllm_omni_speech_first_audio_seconds_count{route="speech",text_mode="whole"}'] == 1
    assert rows['vllm_omni_speech_frames_total{route="speech"}'] == 5
    assert rows['vllm_omni_speech_audio_seconds_total{route="speech"}'] == pytest.approx(0.4)
    buckets = [key for key in rows if key.startswith("vllm_omni_speech_first_audio_seconds_bucket")]
    assert len(buckets) == len(BUCKETS_S) + 1  # 10 ms .. 10 s, and +Inf


def test_a_whole_answer_records_its_first_audio_when_it_is_delivered():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    meter = Meter("batch", "whole", seconds_per_frame=0.08, metrics=SpeechMetrics(registry), whole=True)
    meter.sent(4)
    assert 'vllm_omni_speech_first_audio_seconds_count{route="batch",text_mode="whole"}' not in exposition(registry)
    meter.delivered()
    meter.delivered()
    rows = exposition(registry)
    assert rows['vllm_omni_speech_first_audio_seconds_count{route="batch",text_mode="whole"}'] == 1
    assert rows['vllm_omni_speech_frames_total{route="batch"}'] == 4


def test_the_dashboard_shows_every_speech_metric_and_queries_no_other():
    import json
    import re
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    SpeechMetrics(registry)
    defined = {family.name for family in registry.collect()}  # counters without their _total
    dashboard = json.loads((Path(__file__).parents[3] / "examples/grafana/speech_dashboard.json").read_text())
    queried = {
        re.sub(r"_(total|bucket)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"vllm_omni_speech_\w+", target["expr"])
    }
    assert queried == defined
