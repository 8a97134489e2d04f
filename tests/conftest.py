"""Shared fixtures: random-weight checkpoints in the released layout, written once per session.

Helpers shared by several test modules live here as fixtures or in :mod:`vllm_omni.edge.testing`;
test modules never import each other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.edge.testing.make_checkpoint import write_checkpoint


@pytest.fixture(scope="session", autouse=True)
def device_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-device state (verified files, optimized onnxruntime graphs) goes to a temporary directory, not ~/.cache.

    Subprocesses the tests start inherit it through the environment.
    """
    import os

    from vllm_omni.edge.integrity import CACHE_ENV

    directory = tmp_path_factory.mktemp("device-cache")
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(directory)
    yield directory
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", "small", seed=0)


@pytest.fixture(scope="session")
def talker_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole model directory: small-geometry decoder plus a tiny random-weight talker and BPE tokenizer."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "talker", "small", seed=0, talker="tiny")


@pytest.fixture(scope="session")
def small_decoder(small_checkpoint: Path):
    return load_code2wav_decoder(small_checkpoint)
