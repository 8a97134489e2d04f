"""The uploaded-voice store on its own: the directory is the truth, bounded, and a bad file never breaks it;
processes sharing it (``--api-server-count``) create voices one at a time, within the limits, and see replacements;
its files are private; the server reads them off its event loop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_omni.entrypoints.voices.voice_store import VoiceStore, VoiceStoreError
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError, VoiceClonePrompt

pytestmark = pytest.mark.vllm  # prompt_builder's config needs transformers (the serving venv)

HIDDEN = 8


def store(directory: Path, voices: int = 3) -> VoiceStore:
    return VoiceStore(directory, voices, 1 << 20, HIDDEN, 16, 2048)


def voice(codes: int | None = 4, offset: float = 0.0) -> VoiceClonePrompt:
    frames = None if codes is None else tuple(tuple(range(j, j + 16)) for j in range(codes))
    embedding = tuple(float(i) + offset for i in range(HIDDEN))
    return VoiceClonePrompt(embedding, frames, None if codes is None else "Words.")


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
    voices.save("two", voice(), "c")
    voices.check_room("one")  # a name in use is replaced in place: it needs no room of its own
    with pytest.raises(VoiceStoreError, match="the voice store is full") as full:
        voices.check_room("three")
    assert full.value.status == 507 and sorted(p.name for p in tmp_path.iterdir()) == [
        ".lock",  # the store's lock, held around each room check and write
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


def test_a_voice_replaced_through_another_process_is_read_again_and_only_then(tmp_path, monkeypatch):
    """Each get and list checks the file's identity (one stat): a voice deleted and uploaded again elsewhere
    is read anew; an unchanged one is not read again."""
    first, second = store(tmp_path), store(tmp_path)  # two API server processes
    for name in ("alice", "bob", "carol"):
        first.save(name, voice(), "synthetic")
    reads = []
    read = VoiceStore._read
    monkeypatch.setattr(VoiceStore, "_read", lambda self, path: reads.append(path.name) or read(self, path))
    assert [v.name for v in second.list()] == ["alice", "bob", "carol"] and len(reads) == 3
    assert second.get("alice").voice == voice() and [v.name for v in second.list()] == ["alice", "bob", "carol"]
    assert len(reads) == 3  # known, unchanged: one stat each, no read
    first.delete("alice")
    first.save("alice", voice(offset=0.5), "synthetic, again")  # the same size: only the file's identity differs
    got = second.get("alice")
    assert got.voice == voice(offset=0.5) and got.consent == "synthetic, again" and reads[3:] == ["alice.safetensors"]
    first.delete("bob")
    first.save("bob", voice(None), "synthetic")
    listed = {v.name: v for v in second.list()}
    assert listed["bob"].voice == voice(None) and reads[4:] == ["bob.safetensors"]
    first.delete("carol")
    assert second.get("carol") is None and [v.name for v in second.list()] == ["alice", "bob"]


def _upload_at(directory: Path, name: str, voices: int, max_bytes: int, start, results, offset: float) -> None:
    """One process of :func:`_at_once`: its own store on ``directory``, saving ``name`` (its own vectors, shifted
    by ``offset``) once all have started."""
    mine = VoiceStore(directory, voices, max_bytes, HIDDEN, 16, 2048)
    start.wait()
    try:
        mine.save(name, voice(offset=offset), "synthetic")
        results.put((name, 201))
    except VoiceStoreError as error:
        results.put((name, error.status))
    except BaseException as error:  # reported to the test, not lost in a child
        results.put((name, repr(error)))


def _at_once(directory: Path, names: list[str], voices: int = 256, max_bytes: int = 1 << 20) -> list[int]:
    """``names`` saved by as many processes at the same moment (a barrier): their statuses, in order."""
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(len(names)), context.Queue()
    processes = [
        context.Process(target=_upload_at, args=(directory, name, voices, max_bytes, start, results, float(i)))
        for i, name in enumerate(names)
    ]
    for process in processes:
        process.start()
    statuses = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return [status for _, status in sorted(statuses, key=lambda pair: names.index(pair[0]))]


def test_processes_uploading_one_name_at_once_leave_one_of_their_voices_whole(tmp_path):
    """Six processes upload one name at the same moment, each with its own vectors: each upload replaces the one
    before (upstream's re-upload), and what stays is exactly one of the six, never a mix."""
    for round_ in range(4):
        name = f"same-{round_}"
        assert _at_once(tmp_path, [name] * 6) == [201] * 6
        kept = store(tmp_path).get(name)
        assert kept is not None and kept.voice in [voice(offset=float(i)) for i in range(6)]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [f"same-{i}.safetensors" for i in range(4)]


@pytest.mark.parametrize("limit", ["voices", "bytes"])
def test_twenty_concurrent_uploads_never_pass_the_limits(tmp_path, limit):
    size = store(tmp_path / "probe").save("name-00", voice(), "synthetic").size_bytes  # as every name below
    voices, max_bytes = (5, 1 << 20) if limit == "voices" else (256, 5 * size + size // 2)
    directory = tmp_path / "voices"
    statuses = _at_once(directory, [f"name-{i:02d}" for i in range(20)], voices, max_bytes)
    assert sorted(statuses) == [201] * 5 + [507] * 15, statuses
    files = list(directory.glob("*.safetensors"))
    assert len(files) == 5 and sum(f.stat().st_size for f in files) <= max_bytes
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".upload-")]  # no temporary left


def test_voice_files_are_private_whatever_the_umask(tmp_path):
    directory = tmp_path / "artifacts" / "voices"
    old_umask = os.umask(0)
    try:
        voices = store(directory)
        voices.save("alice", voice(), "synthetic")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()} == {
        "alice.safetensors": 0o600,
        ".lock": 0o600,
    }
    # A directory left open by an older server (0755, a 0644 voice, a temporary of a write that was killed):
    directory.chmod(0o755)
    (directory / "alice.safetensors").chmod(0o644)
    (directory / ".upload-killed.tmp").write_bytes(b"half a voice")
    restarted = store(directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "alice.safetensors").stat().st_mode) == 0o600
    assert not (directory / ".upload-killed.tmp").exists() and restarted.get("alice").voice == voice()


def test_the_server_reads_voice_files_off_its_event_loop(tmp_path, monkeypatch):
    """A speech request naming an uploaded voice, the voice list, an upload's checks and a delete: every read
    of a voice file happens on a worker thread, never on the event loop."""
    from vllm_omni.entrypoints.openai.speech_api import speech_body_model, to_speech_request
    from vllm_omni.entrypoints.openai.speech_limits import SpeechLimits
    from vllm_omni.entrypoints.server.speech_service import SpeechService
    from vllm_omni.entrypoints.voices.voice_service import VoiceService

    store(tmp_path).save("alice", voice(), "synthetic")
    reads = []
    read = VoiceStore._read

    def watched(self, path):
        try:
            asyncio.get_running_loop()
            reads.append(("on the event loop", threading.current_thread().name))
        except RuntimeError:
            reads.append(("off the loop", threading.current_thread().name))
        return read(self, path)

    monkeypatch.setattr(VoiceStore, "_read", watched)
    config = SimpleNamespace(tts_model_type="base", talker_config=SimpleNamespace(spk_is_dialect={}))
    voices = VoiceService(store(tmp_path))
    speech = SpeechService(SimpleNamespace(config=config), SpeechLimits(), ("m",), None, voices)
    body = speech_body_model()

    async def speak(**fields):
        request = to_speech_request(body.model_validate({"input": "Hi", **fields}), voices.store)
        return await speech.resolve_voice(request)

    async def serve():
        request = await speak(voice="alice")
        assert reads and all(where == "off the loop" for where, _ in reads), reads
        store(tmp_path).delete("alice")  # and uploaded again, through another process
        store(tmp_path).save("alice", voice(offset=1.0), "synthetic")
        listed = await speech.voice_list()
        again, nobody = await speak(voice="alice"), await speak(voice="nobody")
        with pytest.raises(SpeechRequestError, match="give one voice to clone: uploaded_voice and speaker_embedding"):
            await speak(voice="alice", speaker_embedding=[0.0] * HIDDEN)
        await voices.files(voices.store.check_room, "bob")
        await voices.files(voices.store.delete, "alice")
        return request, listed, again, nobody

    request, listed, again, nobody = asyncio.run(serve())
    assert request.voice == voice() and request.uploaded_voice is None and request.speaker is None
    assert [row["name"] for row in listed["uploaded_voices"]] == ["alice"] and again.voice == voice(offset=1.0)
    assert listed["voices"] == ["alice", "default"]
    assert (nobody.voice, nobody.speaker) == (None, "nobody")  # the checkpoint refuses it: no preset speakers
    assert reads and all(where == "off the loop" for where, _ in reads), reads
