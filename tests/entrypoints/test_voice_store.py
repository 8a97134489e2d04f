"""The uploaded-voice store on its own: the directory is the truth, bounded, and a bad file never breaks it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vllm_omni.entrypoints.voice_store import VoiceStore, VoiceStoreError
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

pytestmark = pytest.mark.vllm  # prompt_builder's config needs transformers (the serving venv)

HIDDEN = 8


def store(directory: Path, voices: int = 3) -> VoiceStore:
    return VoiceStore(directory, voices, 1 << 20, HIDDEN, 16, 2048)


def voice(codes: int | None = 4) -> VoiceClonePrompt:
    frames = None if codes is None else tuple(tuple(range(j, j + 16)) for j in range(codes))
    return VoiceClonePrompt(tuple(float(i) for i in range(HIDDEN)), frames, None if codes is None else "Words.")


def test_every_process_sees_the_same_directory(tmp_path):
    first, second = store(tmp_path), store(tmp_path)  # two API server processes
    first.save("alice", voice(), "synthetic")
    got = second.get("alice")
    assert got is not None and got.voice == voice() and got.consent == "synthetic"
    assert [v.name for v in second.list()] == ["alice"]
    second.delete("alice")
    assert first.get("alice") is None and first.list() == []
    with pytest.raises(VoiceStoreError, match="no uploaded voice named 'alice'"):
        first.delete("alice")


def test_names_and_limits_are_checked_before_anything_is_written(tmp_path):
    voices = store(tmp_path, voices=2)
    for bad in ("../x", "", "a/b", ".hidden", "x" * 65, "a b"):
        with pytest.raises(VoiceStoreError, match="a voice name is 1-64 letters"):
            voices.check_room(bad)
    voices.save("one", voice(None), "c")
    with pytest.raises(VoiceStoreError, match="exists"):
        voices.check_room("one")
    voices.save("two", voice(), "c")
    with pytest.raises(VoiceStoreError, match="the voice store is full") as full:
        voices.check_room("three")
    assert full.value.status == 507 and sorted(p.name for p in tmp_path.iterdir()) == [
        "one.safetensors",
        "two.safetensors",
    ]


def test_damaged_or_foreign_files_are_skipped_not_fatal(tmp_path):
    from safetensors.numpy import save_file

    voices = store(tmp_path)
    voices.save("good", voice(), "c")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 7)
    (tmp_path / "empty.safetensors").write_bytes(b"")
    save_file({"speaker_embedding": np.zeros(1024, np.float32)}, str(tmp_path / "wide.safetensors"), {"name": "wide"})
    save_file(
        {"speaker_embedding": np.zeros(HIDDEN, np.float32), "reference_codes": np.zeros(16, np.int64)},
        str(tmp_path / "flat.safetensors"),
        {"name": "flat"},
    )
    save_file({"speaker_embedding": np.zeros(HIDDEN, np.float32)}, str(tmp_path / "odd.safetensors"),
              {"name": "odd", "ref_text": "123"})  # fmt: skip
    fresh = store(tmp_path)  # a restart
    assert [v.name for v in fresh.list()] == ["good"]
    assert all(fresh.get(name) is None for name in ("garbage", "empty", "wide", "flat", "odd", "../good"))
