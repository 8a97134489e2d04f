"""The random-weight checkpoint a benchmark runs on, written once and kept across runs.

One writer for every benchmark: the decoder alone (``make_checkpoint``), with a talker (``--talker``), or a
``drive`` variant for the fp16 studies (:mod:`vllm_omni.testing.drive`). A checkpoint is kept when the stamps
its writer recorded say it is the one asked for; otherwise it is written in a child process, so the benchmark's
own process never imports torch for it (``bench_text_stream`` times onnxruntime alone).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from vllm_omni.testing.stamps import is_current


def ensure_checkpoint(
    path: str | Path, geometry: str = "small", *, seed: int = 0, talker: str | None = None, drive: str | None = None
) -> Path:
    """A RANDOM-WEIGHT checkpoint at ``path``: the decoder at ``geometry`` (``small`` or ``released``), with a
    ``talker`` (``tiny`` or ``0.6b``) when asked, its decoder weights those of ``drive`` (``hot`` or
    ``moderate``) when given. Kept when complete and stamped with the same geometry, seed, talker and drive."""
    path = Path(path)
    if is_current(path, geometry, seed, talker=talker, drive=drive):  # the test kit's rule (torch-free)
        return path
    what = f"{geometry} decoder" + (f" ({drive})" if drive else "") + (f" and a {talker} talker" if talker else "")
    print(f"[bench] writing a random-weight checkpoint ({what}, seed {seed}) to {path}", flush=True)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        child.submit(_write, str(path), geometry, seed, talker, drive).result()
    return path


def _write(path: str, geometry: str, seed: int, talker: str | None, drive: str | None) -> None:
    """In the child process: the writers of the test kit."""
    if drive is not None:
        from vllm_omni.testing.drive import write_drive_checkpoint

        write_drive_checkpoint(path, geometry, drive, seed=seed, talker=talker)
    else:
        from vllm_omni.testing.make_checkpoint import write_checkpoint

        write_checkpoint(path, geometry, seed, talker=talker)
