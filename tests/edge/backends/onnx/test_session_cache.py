"""The device cache of optimized step graphs: a miss builds an entry, a hit loads it, a damaged entry is rebuilt."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.backends.onnx.export import export_step_onnx
from vllm_omni.edge.backends.onnx.run import OnnxStepGraph
from vllm_omni.edge.backends.onnx.session_cache import CACHE_ENV, OptimizedModelCache
from vllm_omni.edge.files import file_sha256
from vllm_omni.edge.runtime import StatefulDecoder
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.reference import full_decode


@pytest.fixture(scope="module")
def cpu_graph(small_decoder, tmp_path_factory):
    path = tmp_path_factory.mktemp("cpu-graph") / "step_b1-4.onnx"
    export_step_onnx(small_decoder, 4, path, form="cpu")
    return path, file_sha256(path)


def decode(graph: OnnxStepGraph, frames: np.ndarray) -> np.ndarray:
    stream = StatefulDecoder(graph.runner(), first=graph.runner(2))
    return np.concatenate([stream.feed(frames[:5]), stream.feed(frames[5:]), stream.flush()])


def test_a_miss_caches_the_optimized_graph_and_a_hit_decodes_the_same(cpu_graph, small_decoder, tmp_path):
    path, sha256 = cpu_graph
    cache = OptimizedModelCache(tmp_path / "ort")
    frames = random_codes(31, 16, 2048, seed=3)[0].T.numpy().copy()
    miss = OnnxStepGraph(path, cache=cache, sha256=sha256)
    hit = OnnxStepGraph(path, cache=cache, sha256=sha256)
    assert (miss.cached, hit.cached) == (False, True)
    entry = cache.entry(sha256)
    assert sorted(p.name for p in entry.iterdir()) == ["entry.json", "model.onnx", "weights.bin"]
    reference = full_decode(small_decoder, frames)
    assert snr_db(reference, decode(miss, frames)) >= 110
    assert np.array_equal(decode(miss, frames), decode(hit, frames))


@pytest.mark.parametrize("damage", ["weights", "record", "missing", "unloadable"])
def test_a_damaged_entry_is_rebuilt_not_run(cpu_graph, small_decoder, tmp_path, damage):
    path, sha256 = cpu_graph
    cache = OptimizedModelCache(tmp_path / "ort")
    OnnxStepGraph(path, cache=cache, sha256=sha256)
    entry = cache.entry(sha256)
    if damage == "weights":  # same size, other bytes: only the hash can tell
        weights = entry / "weights.bin"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 64] = b"\x7f" * 64
        weights.write_bytes(bytes(data))
    elif damage == "record":
        (entry / "entry.json").write_text(json.dumps({"files": {"model.onnx": "x"}}))
    elif damage == "unloadable":  # recorded as it is, but not a model: onnxruntime refuses it
        (entry / "model.onnx").write_bytes(b"not a model")
        record = json.loads((entry / "entry.json").read_text())
        record["files"]["model.onnx"] = {"sha256": file_sha256(entry / "model.onnx"), "size_bytes": 11}
        (entry / "entry.json").write_text(json.dumps(record))
    else:
        (entry / "model.onnx").unlink()
    graph = OnnxStepGraph(path, cache=cache, sha256=sha256)
    assert graph.cached is False  # rebuilt from the plan's graph
    frames = random_codes(12, 16, 2048, seed=4)[0].T.numpy().copy()
    assert snr_db(full_decode(small_decoder, frames), decode(graph, frames)) >= 110
    assert OnnxStepGraph(path, cache=cache, sha256=sha256).cached is True


def test_an_unwritable_cache_only_costs_speed(cpu_graph, tmp_path):
    path, sha256 = cpu_graph
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    graph = OnnxStepGraph(path, cache=OptimizedModelCache(blocker / "ort"), sha256=sha256)
    assert graph.cached is False and graph.contract.max_step_frames == 4


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "0")
    assert OptimizedModelCache.default().root is None


def test_entries_beyond_the_limit_are_dropped(cpu_graph, tmp_path, monkeypatch):
    from vllm_omni.edge.backends.onnx import session_cache as onnxruntime_cache

    monkeypatch.setattr(onnxruntime_cache, "MAX_ENTRIES", 1)
    path, sha256 = cpu_graph
    cache = OptimizedModelCache(tmp_path / "ort")
    stale = cache.root / ("0" * 32 + "-old")
    stale.mkdir(parents=True)
    OnnxStepGraph(path, cache=cache, sha256=sha256)
    assert not stale.exists() and cache.entry(sha256).is_dir()
