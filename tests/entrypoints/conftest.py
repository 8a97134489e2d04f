"""The talker's engines, each started once per session and shared by the modules that use it: the offline engine
(generator and serving tests) and a streaming engine per checkpoint (streaming and text-stream tests).

Importable without vLLM (the main venv collects this folder too): vLLM is imported by the fixtures.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

import pytest

from ..conftest import environment_variable

# Engine settings the tests run the tiny talker with (random weights, fp32, a 64 MB KV cache).
ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.3,
    "block_size": 32,
    "max_model_len": 512,
    "kv_cache_memory_bytes": 64 << 20,
}


def in_process_engine_core():
    """vLLM's offline engine core made in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` while the ``LLM`` is
    made; the talker then runs on vLLM's one-process executor): no EngineCore and Worker processes to spawn, each of
    which imports vLLM and torch again (about 20 s of CPU per engine on 2 cores). The variable is put back after,
    so the servers and examples the tests start keep vLLM's default processes; ``AsyncLLM`` always has them."""
    return environment_variable("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def offline_generator():
    """``offline_generator(checkpoint, **engine_overrides)``: a ``CodecFrameGenerator`` with the tests' engine
    settings, its engine core in this process (:func:`in_process_engine_core`), shut down at the end of the session
    with the others: vLLM's parallel groups are global to a process, so one in-process engine that shuts down takes
    them from the engines still running beside it (measured: "pipeline model parallel group is not initialized")."""
    from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator

    made = []

    def make(checkpoint: Path, **overrides):
        with in_process_engine_core():
            made.append(CodecFrameGenerator(checkpoint, **{**ENGINE, **overrides}))
        return made[-1]

    yield make
    for generator in reversed(made):
        generator.shutdown()


@pytest.fixture(scope="session")
def talker_generator(talker_checkpoint: Path, offline_generator):
    """``CodecFrameGenerator`` on the session's tiny talker checkpoint (one engine for every module)."""
    return offline_generator(talker_checkpoint)


@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Base (voice cloning) checkpoint: tiny talker, released-geometry speech tokenizer (12.5 frames per second of
    reference audio, as released) with its speaker encoder and tokenizer encoder; random weights."""
    from vllm_omni.testing.make_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("base") / "ckpt", "released", 0, talker="tiny", talker_type="base")


@pytest.fixture(scope="session")
def voice_design_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A VoiceDesign checkpoint: tiny talker over a small-geometry decoder (seed 1); random weights."""
    from vllm_omni.testing.make_checkpoint import write_checkpoint

    out = tmp_path_factory.mktemp("design") / "ckpt"
    return write_checkpoint(out, "small", 1, talker="tiny", talker_type="voice_design")


@pytest.fixture(scope="session")
def engine_loop():
    """The event loop of every streaming engine of the session: an engine's output handler runs on the loop that
    first used it, so tests drive them with ``engine_loop.run_until_complete``, never ``asyncio.run``."""
    loop = asyncio.new_event_loop()
    yield loop
    pending = asyncio.all_tasks(loop)  # the engines' output handlers
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


class KvUsage:
    """A vLLM stat logger (``stat_loggers=[KvUsage]``) keeping each engine's last scheduler stats, by its config's
    ``instance_id``: the engine's own KV-cache usage and request counts, reported after every engine step."""

    latest: ClassVar[dict[str, object]] = {}

    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        self.key = vllm_config.instance_id

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            KvUsage.latest[self.key] = scheduler_stats

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass


async def kv_freed(generator, seconds: float) -> bool:
    """Whether, within ``seconds``, ``generator``'s engine reports no request and a KV-cache usage of zero (not
    only the API side's count: a leaked engine request or its blocks would show here)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        stats = KvUsage.latest.get(generator.engine.vllm_config.instance_id)
        idle = stats is not None and not stats.num_running_reqs + stats.num_waiting_reqs
        if idle and stats.kv_cache_usage == 0 and not generator.engine.output_processor.get_num_unfinished_requests():
            return True
        await asyncio.sleep(0.1)
    return False


class StreamingEngines:
    """An ``AsyncCodecFrameGenerator`` per checkpoint directory with the tests' engine settings, started when first
    asked for and shut down at the end of the session (an engine start is about 20 s on 2 cores)."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings
        self.started: dict[Path, object] = {}

    def get(self, checkpoint: Path):
        from vllm_omni.entrypoints.generation.speech import AsyncCodecFrameGenerator

        if checkpoint not in self.started:
            self.started[checkpoint] = AsyncCodecFrameGenerator(checkpoint, stat_loggers=[KvUsage], **self.settings)
        return self.started[checkpoint]

    def shutdown(self) -> None:
        for generator in self.started.values():
            generator.shutdown()


@pytest.fixture(scope="session")
def streaming_engines(engine_loop):
    """``streaming_engines.get(checkpoint)``: the session's streaming engine on ``checkpoint`` (run it on
    :func:`engine_loop`)."""
    engines = StreamingEngines(dict(ENGINE))
    yield engines
    engines.shutdown()


SERVER_LOG_LINES = 60  # the server's warnings shown beside a failed test that used a server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that ran against a ``vllm serve`` (any fixture value with a ``log`` path and a ``process``)
    shows the server's warning and error lines beside its failure: what the server logged is often the cause
    (a client is told only "see the server log")."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        log = getattr(value, "log", None)
        if getattr(value, "process", None) is None or not isinstance(log, Path) or not log.is_file():
            continue
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if any(mark in line for mark in ("WARNING", "ERROR", "Error", "Traceback", "failed"))
        ]
        report.sections.append((f"server log of {name!r}: warnings and errors", "\n".join(lines[-SERVER_LOG_LINES:])))
