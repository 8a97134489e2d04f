"""Every vLLM symbol outside its documented API that the talker and the server rely on still exists, where we
use it: a vLLM upgrade that moves one fails here, naming it, instead of at a user's first request."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm  # collected only where vllm imports (tests/conftest.py)

# (module, attribute path, what it is for). docs/talker.md ("vLLM symbols we rely on") lists the same.
SYMBOLS = [
    ("vllm.v1.sample.logits_processor", "LogitsProcessor", "the talker's logits processor base class"),
    ("vllm.v1.sample.logits_processor", "MoveDirectionality.SWAP", "batch rows moved by the persistent batch"),
    ("vllm.v1.sample.logits_processor", "BatchUpdate.added", "rows that joined: (index, params, prompt, outputs)"),
    ("vllm.v1.sample.logits_processor", "BatchUpdate.removed", "rows that left"),
    ("vllm.v1.sample.logits_processor", "BatchUpdate.moved", "rows that moved"),
    ("vllm.forward_context", "get_forward_context", "the step's KV slot mapping (rows of the step)"),
    ("vllm.forward_context", "is_forward_context_available", "a forward outside the engine (profiling)"),
    ("vllm.model_executor.models.qwen3", "Qwen3DecoderLayer", "the talker LM's layers"),
    ("vllm.model_executor.layers.layernorm", "RMSNorm", "the talker LM's final norm"),
    ("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm", "oneDNN GEMMs for the code predictor"),
    ("vllm.platforms", "current_platform", "CPU or GPU checks"),
    ("vllm._custom_ops", "create_onednn_mm", "the fused code predictor's projections on a CPU (oneDNN)"),
    ("vllm.compilation.decorators", "support_torch_compile", "the talker LM compiled on a GPU (PIECEWISE graphs)"),
    ("vllm.v1.sample.sampler", "Sampler.gather_logprobs", "compiled at load (the first request's 3 s otherwise)"),
    ("vllm.v1.sample.sampler", "Sampler.compute_logprobs", "the logprobs the warm-up gathers"),
    ("vllm.config.compilation", "CUDAGraphMode.PIECEWISE", "the CUDA graph modes the talker allows"),
    ("vllm.engine.protocol", "StreamingInput", "text streamed into one running request (streaming-input sessions)"),
    ("vllm.v1.engine.async_llm", "AsyncLLM.generate", "frames streamed from the engine"),
    ("vllm.v1.engine.async_llm", "AsyncLLM._add_streaming_input_request", "resumable chunks of one request"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_request_as_session", "a chunk drops its last sampled token"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._handle_stopped_request", "a chunk's end pauses the request"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_streaming_request", "a resumed chunk keeps its state"),
    ("vllm.entrypoints.cli.serve", "ServeSubcommand", "vllm serve --omni reuses vLLM's serve subcommand"),
    ("vllm.entrypoints.serve.utils.api_utils", "cli_env_setup", "the CLI hand-off's environment set-up (0.32)"),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser", "the CLI hand-off's parser"),
    ("vllm.logger", "configure_logging_from_args", "the CLI hand-off's logging"),
    ("vllm.entrypoints.serve.middleware.authenticate", "GUARDED_PREFIX", "the routes --api-key guards"),
    ("vllm.exceptions", "VLLMClientError", "vLLM's own request checks, as our SpeechRequestError"),
    ("vllm.plugins", "load_plugins_by_group", "VLLM_PLUGINS is an allow-list for every group once set"),
]
# Attributes of vLLM's config and state objects the talker reads (checked on the dataclasses' fields).
FIELDS = [
    ("vllm.config.scheduler", "SchedulerConfig", "async_scheduling", "refused: output lists with placeholders"),
    ("vllm.config.scheduler", "SchedulerConfig", "max_num_seqs", "the talker's row tables; --speech-max-sockets"),
    ("vllm.config.cache", "CacheConfig", "enable_prefix_caching", "refused: residual codes differ per request"),
    ("vllm.config.model", "ModelConfig", "logprobs_mode", "the residual channel needs raw logprobs"),
    ("vllm.config.model", "ModelConfig", "logits_processors", "the talker's logits processor is named there"),
    ("vllm.v1.worker.gpu_input_batch", "CachedRequestState", "output_token_ids", "a parked state's liveness"),
    ("vllm.forward_context", "ForwardContext", "slot_mapping", "every backend's slots: rows without metadata"),
    ("vllm.config.vllm", "VllmConfig", "instance_id", "one TalkerBatch per engine"),
    ("vllm.config.cache", "CacheConfig", "block_size", "where a request's slots may jump"),
    ("vllm.config.compilation", "CompilationConfig", "cudagraph_mode", "FULL modes refused, PIECEWISE allowed"),
    ("vllm.config.vllm", "VllmConfig", "additional_config", "code_predictor_cuda_graphs"),
]


@pytest.mark.parametrize(("module", "path", "use"), SYMBOLS, ids=[f"{m}:{p}" for m, p, _ in SYMBOLS])
def test_a_vllm_symbol_we_rely_on_is_where_we_use_it(module, path, use):
    try:
        target = importlib.import_module(module)
    except ImportError as error:
        pytest.fail(f"vLLM moved {module} ({use}): {error}; update the talker and docs/talker.md")
    for part in path.split("."):
        if not hasattr(target, part):
            annotations = getattr(target, "__annotations__", {}) if inspect.isclass(target) else {}
            if part in annotations or part in getattr(target, "__dataclass_fields__", {}):
                break  # a declared field of a dataclass / NamedTuple
            pytest.fail(f"vLLM has no {module}.{path} any more ({use}): update the talker and docs/talker.md")
        target = getattr(target, part)


@pytest.mark.parametrize(("module", "cls", "field", "use"), FIELDS, ids=[f"{c}.{f}" for _, c, f, _ in FIELDS])
def test_a_vllm_config_field_we_read_exists(module, cls, field, use):
    owner = getattr(importlib.import_module(module), cls)
    fields = set(getattr(owner, "__dataclass_fields__", {})) | set(getattr(owner, "model_fields", {}))
    fields |= set(getattr(owner, "__annotations__", {}))
    assert field in fields, f"vLLM's {module}.{cls} has no field {field} any more ({use}): update the talker"


def test_the_docs_list_every_symbol():
    docs = (Path(__file__).resolve().parents[4] / "docs" / "talker.md").read_text()
    missing = [f"{m}.{p}" for m, p, _ in SYMBOLS if f"{m}.{p}" not in docs]
    missing += [f"{c}.{f}" for _, c, f, _ in FIELDS if f"{c}.{f}" not in docs]
    assert not missing, f"docs/talker.md does not list {missing}"
