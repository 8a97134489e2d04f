"""``vllm serve --omni``'s command line gets the talker's engine settings where the user left vLLM's defaults: on a
CPU, and as a GPU machine would resolve them (eager unless a CUDA graph mode was asked for)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)


def _parsed(*flags: str):
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_omni.entrypoints.cli.serve import OmniServeSubcommand

    parser = FlexibleArgumentParser()
    OmniServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    return parser.parse_args(["serve", "ckpt", *flags])


def _applied(monkeypatch, gpu: bool, *flags: str):
    from vllm.platforms import current_platform

    from vllm_omni.entrypoints.cli.serve import apply_talker_engine_settings

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: not gpu)
    args = _parsed(*flags)
    apply_talker_engine_settings(args, argv=["vllm", "serve", "ckpt", "--omni", *flags])
    return args


def test_the_defaults_left_are_filled_on_a_cpu_and_a_gpu(monkeypatch):
    from vllm_omni.model_executor.models.qwen3_tts.engine_contract import LOGITS_PROCESSOR

    args = _applied(monkeypatch, False)
    assert args.enforce_eager is False  # a CPU runs the talker eagerly anyway: vLLM's default stays
    assert args.async_scheduling is False and args.enable_prefix_caching is False and args.skip_tokenizer_init
    assert LOGITS_PROCESSOR in args.logits_processors and args.logprobs_mode == "raw_logprobs"
    assert _applied(monkeypatch, True).enforce_eager is True  # a GPU: eager unless a graph mode was asked for


def test_a_users_own_choices_are_kept_for_the_start_up_check_to_judge(monkeypatch):
    from vllm_omni.model_executor.models.qwen3_tts.engine_contract import MAX_LOGPROBS

    args = _applied(monkeypatch, True, "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}')
    assert args.enforce_eager is False and args.compilation_config.cudagraph_mode.name == "PIECEWISE"
    args = _applied(monkeypatch, True, "--async-scheduling", "--enable-prefix-caching")
    assert args.async_scheduling is True and args.enable_prefix_caching is True  # refused at start-up, named
    assert _applied(monkeypatch, True, "--no-enforce-eager").enforce_eager is False  # said, though the default
    assert _applied(monkeypatch, False, "--max-logprobs", "-1").max_logprobs == -1  # vLLM's "no cap" is enough
    assert _applied(monkeypatch, False, "--max-logprobs", "4").max_logprobs == MAX_LOGPROBS  # raised: the channel
