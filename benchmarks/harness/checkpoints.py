"""The random-weight checkpoint a benchmark runs on, written once and kept across runs.

One writer for every benchmark: the decoder alone (``make_checkpoint``), with a talker (``--talker``), or a
``drive`` variant for the fp16 studies (:mod:`vllm_omni.testing.drive`). A checkpoint is kept when the stamps
its writer recorded say it is the one asked for; otherwise it is written in a child process, so the benchmark's
own process never imports torch for it (``bench_text_stream`` times onnxruntime alone).
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Where make_checkpoint writes its stamps (the released layout; vllm_omni.testing.make_checkpoint,
# vllm_omni.testing.talker_checkpoint). Read here as plain JSON: importing the writers imports torch.
SPEECH_TOKENIZER_CONFIG = Path("speech_tokenizer") / "config.json"
SPEECH_TOKENIZER_WEIGHTS = Path("speech_tokenizer") / "model.safetensors"
TALKER_CONFIG = Path("config.json")
TALKER_WEIGHTS = Path("model.safetensors")


def ensure_checkpoint(
    path: str | Path, geometry: str = "small", *, seed: int = 0, talker: str | None = None, drive: str | None = None
) -> Path:
    """A RANDOM-WEIGHT checkpoint at ``path``: the decoder at ``geometry`` (``small`` or ``released``), with a
    ``talker`` (``tiny`` or ``0.6b``) when asked, its decoder weights those of ``drive`` (``hot`` or
    ``moderate``) when given. Kept when complete and stamped with the same geometry, seed and talker."""
    path = Path(path)
    if _complete(path, geometry, seed, talker):
        return path
    what = f"{geometry} decoder" + (f" ({drive})" if drive else "") + (f" and a {talker} talker" if talker else "")
    print(f"[bench] writing a random-weight checkpoint ({what}, seed {seed}) to {path}", flush=True)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        child.submit(_write, str(path), geometry, seed, talker, drive).result()
    return path


def _stamp(config: Path) -> dict | None:
    try:
        stamp = json.loads(config.read_text()).get("random_weights")
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _complete(path: Path, geometry: str, seed: int, talker: str | None) -> bool:
    decoder = _stamp(path / SPEECH_TOKENIZER_CONFIG)
    if not (decoder and (path / SPEECH_TOKENIZER_WEIGHTS).is_file()):
        return False
    if (decoder.get("geometry"), decoder.get("seed")) != (geometry, seed):
        return False
    if talker is None:
        return True
    stamp = _stamp(path / TALKER_CONFIG)
    return bool(stamp and stamp.get("talker_geometry") == talker and (path / TALKER_WEIGHTS).is_file())


def _write(path: str, geometry: str, seed: int, talker: str | None, drive: str | None) -> None:
    """In the child process: the writers of the test kit."""
    if drive is not None:
        from vllm_omni.testing.drive import write_drive_checkpoint

        write_drive_checkpoint(path, geometry, drive, seed=seed, talker=talker)
    else:
        from vllm_omni.testing.make_checkpoint import write_checkpoint

        write_checkpoint(path, geometry, seed, talker=talker)
