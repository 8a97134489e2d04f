"""Uploaded voices of a Base checkpoint, encoded once and kept on disk: ``POST/GET/DELETE /v1/audio/voices``.

A voice is one safetensors file under the server's artifacts directory (``voices/NAME.safetensors``):
``speaker_embedding`` (float32) and, for in-context cloning, ``reference_codes`` (int64 ``[T, 16]``),
with its transcript, mode and consent in the metadata. Later requests name it as ``voice`` and nothing
is encoded again; a restart reads the directory back. Names are checked against :data:`NAME_PATTERN`
before anything touches the filesystem; the store is bounded in entries and bytes.

Every API server process of a server (``--api-server-count``) has its own :class:`VoiceStore` on the one
directory, which is the only truth:

* a voice is written in one step across processes: its file is written in full under a temporary name,
  then renamed to ``NAME.safetensors`` (an upload of a name in use replaces that voice, as upstream
  vLLM-Omni's does: a reader opens the old file or the new one, never a mix), and the room check and the write
  hold an exclusive ``flock`` on ``voices/.lock``, so concurrent uploads, in any process, cannot pass
  ``--speech-max-voices`` or ``--speech-max-voice-bytes``;
* a process keeps the voices it read, each with its file's identity (device, inode, size, mtime from one
  ``stat``), and reads a file again when its identity changes: a voice replaced (or deleted and uploaded again)
  through another process is spoken with its new vectors on the next request;
* voice prints are biometric data: the directory is 0700 (a wider one is tightened) and files are 0600.

The methods block (``stat``, reads, ``fsync``, the lock): the server calls them on a thread pool
(:meth:`.voice_service.VoiceService.files`), never on its event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm_omni.errors import RequestRefused

if TYPE_CHECKING:
    from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

logger = logging.getLogger("vllm.omni.voices")  # under vLLM's logger: its handlers and level apply
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
SUFFIX = ".safetensors"
LOCK_NAME = ".lock"  # flock'ed around every room check + write (never a voice: no suffix, and hidden)
TEMP_PREFIX, TEMP_SUFFIX = ".upload-", ".tmp"  # a voice being written; removed on failure, or at start
DIRECTORY_MODE, FILE_MODE = 0o700, 0o600


class VoiceStoreError(RequestRefused, ValueError):
    """A voice the store refuses: ``status`` (HTTP) and a message saying what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, status)


# What an upload may say of itself besides its vectors (upstream's voice fields), kept in the file's metadata.
DETAILS = ("mime_type", "file_size", "speaker_description", "embedding_source")


@dataclass(frozen=True)
class StoredVoice:
    name: str
    voice: VoiceClonePrompt
    created: float
    consent: str
    size_bytes: int
    details: dict[str, Any] = field(default_factory=dict)  # DETAILS given at upload

    def describe(self) -> dict[str, Any]:
        """Upstream vLLM-Omni's description of an uploaded voice (``name``, ``consent``, ``created_at``,
        ``file_size``, ``mime_type``, ``embedding_source``, ``embedding_dim``, ``ref_text`` and
        ``speaker_description`` when given), and ours (``mode``, ``reference_frames``, ``created`` in seconds)."""
        source = self.details.get("embedding_source", "audio")
        described = {
            "name": self.name,
            "consent": self.consent,
            "created_at": int(self.created),
            "file_size": int(self.details.get("file_size", 0)),
            "mime_type": str(self.details.get("mime_type", "")),
            "embedding_source": source,
            "embedding_dim": len(self.voice.speaker_embedding) if source == "direct" else None,
            "mode": "x_vector" if self.voice.x_vector_only else "in_context",
            "reference_frames": len(self.voice.reference_codes or ()),
            "created": self.created,
        }
        if self.voice.reference_text:
            described["ref_text"] = self.voice.reference_text
        if self.details.get("speaker_description"):
            described["speaker_description"] = self.details["speaker_description"]
        return described


@dataclass(frozen=True)
class _Known:
    """A file this process read: its identity then, and its voice (None: not a voice of this talker)."""

    identity: tuple[int, int, int, int]
    stored: StoredVoice | None


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one version of a file from another: a new file (a voice deleted and uploaded again) has its
    own inode and mtime (set to the nanosecond when written), a rewritten one its mtime."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def check_name(name: Any) -> str:
    """``name`` if it is a voice name (letters, digits, ``_``, ``-``; 1-64; starting alphanumeric)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise VoiceStoreError(400, "a voice name is 1-64 letters, digits, '_' or '-', starting with a letter or digit")
    return name


class VoiceStore:
    """The uploaded voices in ``directory``, at most ``max_voices`` of them in ``max_bytes``
    (``--speech-max-voices``, ``--speech-max-voice-bytes``: every ``NAME.safetensors`` file counts), for a
    talker of ``hidden_size``.

    The directory is the truth, so every API server process of one server sees the same voices (module
    docstring). A file that does not read as a voice of this talker (damaged, another model's width, codes
    out of range) is skipped with a warning, never served; it keeps its name until DELETEd.
    """

    def __init__(self, directory: Path, max_voices: int, max_bytes: int, hidden_size: int, groups: int, codebook: int):
        self.directory, self.max_voices, self.max_bytes = Path(directory), max_voices, max_bytes
        self.shape = (hidden_size, groups, codebook)
        self._lock = threading.Lock()  # guards _known (the server's threads share a store)
        self._known: dict[str, _Known] = {}
        self._private = False
        try:
            self._make_private()
        except OSError as error:  # serving what is there still works; an upload retries, and answers 507
            logger.warning("voice directory %s: %s: %s", self.directory, type(error).__name__, error)

    def get(self, name: str) -> StoredVoice | None:
        """The voice ``name``, or None: one ``stat``, and a read only if this process has not read the file as
        it is now (new to it, or replaced through another process)."""
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            return None
        try:
            status = os.stat(self._path(name), follow_symlinks=False)
        except OSError:
            status = None
        return self._current(name, status)

    def list(self) -> list[StoredVoice]:
        """The voices by name: the directory listed with one ``stat`` a file; only new or changed files are read."""
        files = self._files()
        with self._lock:
            for gone in self._known.keys() - files.keys():
                del self._known[gone]
        voices = (self._current(name, status) for name, status in sorted(files.items()))
        return [stored for stored in voices if stored is not None]

    def check_room(self, name: str, size_bytes: int = 0) -> None:
        """Raise 507 unless the voice ``name`` (of ``size_bytes``, once known) fits, in place of a voice of that
        name if there is one. A server checks before encoding (nothing is held then), and :meth:`save` again,
        under the lock."""
        check_name(name)
        files = self._files()
        replaced = files.pop(name, None)
        if replaced is None and os.path.lexists(self._path(name)):
            raise VoiceStoreError(409, f"{name!r} is taken by a file that is not a voice; DELETE it first")
        used = sum(status.st_size for status in files.values())
        if len(files) + 1 > self.max_voices or used + max(size_bytes, 1) > self.max_bytes:
            raise VoiceStoreError(
                507,
                f"the voice store is full ({len(files)} voices, {used} bytes; limits {self.max_voices} voices, "
                f"{self.max_bytes} bytes): DELETE voices no longer used",
            )

    def save(
        self, name: str, voice: VoiceClonePrompt, consent: str, details: dict[str, Any] | None = None
    ) -> StoredVoice:
        """Write ``voice`` as ``name`` (replacing a voice of that name, in one step), with the upload's ``details``
        (:data:`DETAILS`): 507 over the limits or unwritable. The room is checked and the file renamed into place
        under the store's lock; the file is written whole under a temporary name first."""
        from safetensors.numpy import save

        check_name(name)
        tensors = {"speaker_embedding": np.asarray(voice.speaker_embedding, dtype=np.float32)}
        if voice.reference_codes is not None:
            tensors["reference_codes"] = np.asarray(voice.reference_codes, dtype=np.int64)
        kept = {key: value for key, value in (details or {}).items() if key in DETAILS and value is not None}
        metadata = {"name": name, "ref_text": json.dumps(voice.reference_text), "consent": consent}
        metadata["details"] = json.dumps(kept)
        data = save(tensors, metadata=metadata | {"created": repr(time.time())})
        stored = self._decode(data, name)  # the voice as every process reads it back (float32), not as given
        try:
            self._make_private()
            with self._exclusive():
                self.check_room(name, len(data))
                status = self._create(self._path(name), data)
        except OSError as error:
            logger.warning("cannot write voice %s: %s: %s", name, type(error).__name__, error)
            raise VoiceStoreError(507, f"the server cannot store voices ({type(error).__name__})") from None
        with self._lock:
            self._known[name] = _Known(_identity(status), stored)
        return stored

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock:
            self._known.pop(name, None)
        try:
            os.unlink(self._path(name))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise VoiceStoreError(404, f"no uploaded voice named {name!r}") from None

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}{SUFFIX}"

    def _files(self) -> dict[str, os.stat_result]:
        """Every ``NAME.safetensors`` regular file of the directory (not a symlink), with its ``stat``."""
        files = {}
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    stem = entry.name.removesuffix(SUFFIX)
                    if stem == entry.name or not NAME_PATTERN.fullmatch(stem):
                        continue
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        status = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(status.st_mode):
                            files[stem] = status
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return files

    def _current(self, name: str, status: os.stat_result | None) -> StoredVoice | None:
        """The voice of the file ``name`` whose ``stat`` is ``status`` (None: absent), read if not known as such."""
        if status is None or not stat.S_ISREG(status.st_mode):
            with self._lock:
                self._known.pop(name, None)
            return None
        with self._lock:
            known = self._known.get(name)
        if known is None or known.identity != _identity(status):
            known = self._read(self._path(name))
            with self._lock:
                if known is None:  # gone since the stat
                    self._known.pop(name, None)
                else:
                    self._known[name] = known
        return known.stored if known is not None else None

    def _read(self, path: Path) -> _Known | None:
        """The file ``path`` as it is now (its identity from the handle read, so a file replaced meanwhile is
        known as the version read), or None if it is gone. A file that is not a voice of this talker is known
        with no voice, so it is warned about once, not on every request."""
        try:  # never a symlink (ELOOP), never blocked on a FIFO
            handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with open(handle, "rb") as file:
            status = os.fstat(handle)
            data = file.read(self.max_bytes + 1) if stat.S_ISREG(status.st_mode) else b""
        try:
            if len(data) > self.max_bytes:
                raise ValueError(f"{status.st_size} bytes, over the store's limit of {self.max_bytes}")
            stored = self._decode(data, path.name.removesuffix(SUFFIX))
        except Exception as error:  # safetensors raises its own types for a damaged file
            logger.warning("voice file %s skipped: %s: %s", path, type(error).__name__, error)
            stored = None
        return _Known(_identity(status), stored)

    def _decode(self, data: bytes, stem: str) -> StoredVoice:
        """The voice in ``data`` (a safetensors file named ``stem``); ValueError (or safetensors' errors) if it is
        not one this talker can use."""
        from safetensors.numpy import load

        from vllm_omni.model_executor.models.qwen3_tts.engine_contract import VOICE_SLOTS
        from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import VoiceClonePrompt

        hidden, groups, codebook = self.shape
        tensors = load(data)  # checks the header and every tensor's bounds
        (header_bytes,) = struct.unpack_from("<Q", data)
        metadata = json.loads(data[8 : 8 + header_bytes]).get("__metadata__") or {}
        if "speaker_embedding" not in tensors:
            raise ValueError("no speaker_embedding")
        embedding, codes = tensors["speaker_embedding"], tensors.get("reference_codes")
        name = check_name(metadata.get("name", ""))
        reference_text = json.loads(metadata.get("ref_text", "null"))
        if name != stem or not (reference_text is None or isinstance(reference_text, str)):
            raise ValueError("its metadata does not name it, or its ref_text is not text")
        if embedding.shape != (hidden,) or not np.isfinite(embedding).all():
            raise ValueError(f"a speaker embedding of shape {embedding.shape}; this talker takes ({hidden},)")
        if codes is not None and (
            codes.ndim != 2 or codes.shape[1] != groups or not 0 < len(codes) < VOICE_SLOTS
            or codes.min() < 0 or codes.max() >= codebook
        ):  # fmt: skip
            raise ValueError(f"reference codes of shape {codes.shape} do not fit this talker")
        voice = VoiceClonePrompt(
            tuple(float(x) for x in embedding),
            None if codes is None else tuple(tuple(int(c) for c in frame) for frame in codes),
            reference_text,
        )
        created, consent = float(metadata.get("created", "0")), str(metadata.get("consent", ""))
        details = json.loads(metadata.get("details", "{}"))
        if not isinstance(details, dict):
            raise ValueError("its details are not a JSON object")
        return StoredVoice(name, voice, created, consent, len(data), details)

    def _create(self, path: Path, data: bytes) -> os.stat_result:
        """``path`` holding ``data`` (0600), in one step: a voice there before is replaced whole. Under the store's
        lock."""
        handle, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=self.directory)
        try:
            with open(handle, "wb") as file:
                os.fchmod(handle, FILE_MODE)  # mkstemp's mode already; never wider, whatever the umask
                file.write(data)
                file.flush()
                now = time.time_ns()  # to the nanosecond: a voice replaced within a clock tick still differs
                os.utime(handle, ns=(now, now))
                os.fsync(handle)
                status = os.fstat(handle)
            os.replace(temporary, path)  # atomic: a reader opens the old voice or the new one
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:  # the new name kept through a power loss
            os.fsync(directory)
        finally:
            os.close(directory)
        return status

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The store's lock, held against every other process and thread (each opens the lock file itself)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        handle = os.open(self.directory / LOCK_NAME, flags, FILE_MODE)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # releases the lock

    def _make_private(self) -> None:
        """The directory created 0700 (a wider one tightened, and its voice files made 0600) and temporaries
        of writes that never finished (a process killed mid-write) removed; once per process. OSError
        (logged by the caller) if it cannot be: no voice is written into a directory others can read."""
        if self._private:
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
        mode = stat.S_IMODE(os.stat(self.directory).st_mode)
        if mode & 0o077:
            try:
                os.chmod(self.directory, DIRECTORY_MODE)
            except OSError as error:
                raise PermissionError(
                    f"the voice directory is mode {mode:o} (open to other users) and this process cannot make it "
                    f"{DIRECTORY_MODE:o} ({error.strerror}): change its mode or owner"
                ) from None
            logger.warning(
                "voice directory %s was mode %o: made %o (voice prints are biometric data)",
                self.directory, mode, DIRECTORY_MODE,
            )  # fmt: skip
        with self._exclusive(), os.scandir(self.directory) as entries:  # no write is under way now
            for entry in entries:
                if entry.name.startswith(TEMP_PREFIX) and entry.name.endswith(TEMP_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                elif (
                    entry.name.endswith(SUFFIX)
                    and entry.is_file(follow_symlinks=False)
                    and stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o077
                ):
                    os.chmod(entry.path, FILE_MODE)  # a voice written before files were private
        self._private = True
