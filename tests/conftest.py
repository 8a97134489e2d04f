"""Shared fixtures: random-weight checkpoints in the released layout, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_omni.edge.audio import snr_db as audio_snr_db
from vllm_omni.edge.decoder_export import load_code2wav_decoder
from vllm_omni.edge.testing.codes import random_codes
from vllm_omni.edge.testing.make_checkpoint import write_checkpoint

__all__ = ["random_codes", "snr_db"]

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def snr_db(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``estimate`` against ``reference`` in dB (inf when identical)."""
    return audio_snr_db(reference.detach().numpy(), estimate.detach().numpy())
