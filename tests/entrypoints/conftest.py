"""The talker's offline engine, started once per session and shared by the generator and serving tests.

Importable without vLLM (the main venv collects this folder too): vLLM is imported by the fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Engine settings the tests run the tiny talker with (random weights, fp32, a 64 MB KV cache).
ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.3,
    "block_size": 32,
    "max_model_len": 512,
    "kv_cache_memory_bytes": 64 << 20,
}


@pytest.fixture(scope="session")
def talker_engine_settings() -> dict:
    """The engine arguments of :func:`talker_generator`, for tests that start an engine of their own."""
    return dict(ENGINE)


@pytest.fixture(scope="session")
def talker_generator(talker_checkpoint: Path):
    """``CodecFrameGenerator`` on the session's tiny talker checkpoint (one engine for every module)."""
    import os

    from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator

    # LLM.apply_model (the tests read the worker's talker state with it) ships a function to the worker.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    generator = CodecFrameGenerator(talker_checkpoint, **ENGINE)
    yield generator
    generator.shutdown()


@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Base (voice cloning) checkpoint: tiny talker, released-geometry speech tokenizer (12.5 frames per second of
    reference audio, as released) with its speaker encoder and tokenizer encoder; random weights."""
    from vllm_omni.edge.testing.make_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("base") / "ckpt", "released", 0, talker="tiny", talker_type="base")
