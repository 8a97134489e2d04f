"""The Qwen3-TTS talker as a vLLM model: text prompt -> codec frames (16 codes per 80 ms).

Registered for the released architecture name ``Qwen3TTSForConditionalGeneration`` by the
``vllm.general_plugins`` entry point (``vllm_omni.plugins:register``); plain vLLM runs it.

* The talker LM is vLLM's own Qwen3 decoder layer stack (paged attention, KV cache). The official
  model applies interleaved multimodal RoPE with three position streams; for speech all three
  streams are the same position, so every rotary frequency sees that position and M-RoPE equals
  1-D RoPE exactly: vLLM's default rotary embedding is used.
* Prompt positions arrive as self-describing ids (``engine_ids``): projected text
  (``text_projection(text_embedding(t))``), optionally plus a codec embedding.
* A generated position holds codebook 0 of frame ``j``. Its input is the sum of the 16 codebook
  embeddings of frame ``j`` plus the ``j``-th streamed text vector (or ``tts_pad``), as the
  official ``Qwen3TTSTalkerForConditionalGeneration.forward``. The residual codes of frame ``j``
  are made here, by the code predictor, from the hidden state that chose codebook 0 and its
  embedding; they are kept per request and sent out through the logits (``engine_ids``).
* ``compute_logits`` returns the codec head's logits widened by the residual channel.

Needs vLLM's v1 model runner (the logits processor interface it uses); see ``check_engine``.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from .code_predictor import Qwen3TTSCodePredictor, picker_for
from .configuration_qwen3_tts import Qwen3TTSConfig
from .engine_ids import RESIDUAL_MARK, engine_vocab_size, residual_columns
from .talker_requests import LOGITS_PROCESSOR, TALKER_BATCH, StepRow, TalkerRequestState


class TalkerEngineError(RuntimeError):
    """The vLLM engine is configured in a way the talker cannot run under; the message says what to set."""


def check_engine(vllm_config) -> None:
    """Refuse engine settings under which the talker's frames would be wrong, naming the fix."""
    model_config = vllm_config.model_config
    problems = []
    if getattr(vllm_config, "use_v2_model_runner", False):
        problems.append(
            "vLLM chose its V2 model runner, whose logits-processor interface the talker does not implement: "
            "set VLLM_USE_V2_MODEL_RUNNER=0"
        )
    processors = [
        p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}" for p in model_config.logits_processors or []
    ]
    if LOGITS_PROCESSOR not in processors:
        problems.append(f"the talker needs its logits processor: pass logits_processors=['{LOGITS_PROCESSOR}']")
    if vllm_config.cache_config.enable_prefix_caching:
        problems.append(
            "prefix caching would share KV blocks between requests whose generated positions look alike but "
            "carry different residual codes: disable it (enable_prefix_caching=False / --no-enable-prefix-caching)"
        )
    if model_config.logprobs_mode != "raw_logprobs":
        problems.append(
            f"logprobs_mode must be 'raw_logprobs' (the residual-code channel), got {model_config.logprobs_mode!r}"
        )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() and not model_config.enforce_eager:
        problems.append(
            "CUDA graphs would replay the talker's forward without its per-request steps (code predictor, frame "
            "state): pass enforce_eager=True (--enforce-eager)"
        )
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding is not supported by the talker")
    if vllm_config.parallel_config.tensor_parallel_size != 1 or vllm_config.parallel_config.pipeline_parallel_size != 1:
        problems.append("the talker runs on one device: tensor/pipeline parallel size must be 1")
    if problems:
        raise TalkerEngineError("Qwen3-TTS talker cannot run with these engine settings:\n- " + "\n- ".join(problems))


class TextProjection(nn.Module):
    """``talker.text_projection``: Linear -> SiLU -> Linear, text width to talker width."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerLM(nn.Module):
    """``talker.model``: codec/text embeddings, Qwen3 decoder layers on vLLM's attention, final norm."""

    def __init__(self, vllm_config, prefix: str) -> None:
        super().__init__()
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer

        config: Qwen3TTSConfig = vllm_config.model_config.hf_config
        talker = config.talker_config
        layer_config = SimpleNamespace(**config.engine_text_config().to_dict())
        self.codec_embedding = nn.Embedding(talker.vocab_size, talker.hidden_size)
        self.text_embedding = nn.Embedding(talker.text_vocab_size, talker.text_hidden_size)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(
                layer_config,
                cache_config=vllm_config.cache_config,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.layers.{index}",
            )
            for index in range(talker.num_hidden_layers)
        )
        self.norm = RMSNorm(talker.hidden_size, eps=talker.rms_norm_eps)

    def forward(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        hidden, residual = inputs_embeds, None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3TTSTalkerForCodecFrames(nn.Module):
    """vLLM model for ``Qwen3TTSForConditionalGeneration`` checkpoints (CustomVoice / VoiceDesign)."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        check_engine(vllm_config)
        config: Qwen3TTSConfig = vllm_config.model_config.hf_config
        talker = config.talker_config
        self.config = config
        self.codec_vocab = talker.vocab_size
        self.text_vocab = talker.text_vocab_size
        self.groups = talker.num_code_groups
        self.codebook_size = talker.codebook_size
        self.vocab = engine_vocab_size(self.codec_vocab, self.groups, self.codebook_size)
        self.model = TalkerLM(vllm_config, prefix="model")
        self.text_projection = TextProjection(talker.text_hidden_size, talker.hidden_size)
        self.codec_head = nn.Linear(talker.hidden_size, talker.vocab_size, bias=False)
        self.code_predictor = Qwen3TTSCodePredictor(talker.code_predictor_config, talker.hidden_size)
        self.tts_pad_token_id = config.tts_pad_token_id

    # -- inputs -----------------------------------------------------------------------------

    def project_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_prompt_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of encoded prompt ids (``engine_ids.encode_prompt_id``)."""
        pair = ids >= self.text_vocab
        offset = (ids - self.text_vocab).clamp(min=0)
        text_ids = torch.where(pair, offset // self.codec_vocab, ids).clamp(0, self.text_vocab - 1)
        codec_ids = torch.where(pair, offset % self.codec_vocab, torch.zeros_like(ids))
        embeds = self.project_text(text_ids)
        return embeds + self.model.codec_embedding(codec_ids) * pair.unsqueeze(-1).to(embeds.dtype)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_ids(input_ids.long())

    def _row_segments(self, num_tokens: int) -> list[tuple[int, int]]:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return []
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            metadata = metadata[0] if metadata else None
        if not metadata:
            return []
        layer_metadata = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
        starts = layer_metadata.query_start_loc.tolist()
        return [(starts[i], min(starts[i + 1], num_tokens)) for i in range(len(starts) - 1)]

    def _generated_inputs(self, state: TalkerRequestState, codes0: list[int], steps: list[int]) -> list[list[int]]:
        """Frames for generated positions ``steps`` (frame indices), making the newest with the code predictor."""
        frames = []
        for code0, step in zip(codes0, steps, strict=True):
            if step < len(state.frames):
                frames.append(state.frames[step])
                continue
            if step != len(state.frames) or state.last_hidden is None:
                raise RuntimeError(
                    f"talker request {state.spec.request_key}: frame {step} requested with {len(state.frames)} "
                    "frames known; the engine fed positions out of order"
                )
            spec = state.spec
            pick = picker_for(
                [
                    (
                        spec.subtalker_greedy,
                        spec.subtalker_temperature,
                        spec.subtalker_top_k,
                        spec.subtalker_top_p,
                        state.generator,
                    )
                ]
            )
            code0_tensor = torch.tensor([code0], dtype=torch.long, device=state.last_hidden.device)
            residuals = self.code_predictor.predict(
                state.last_hidden.unsqueeze(0), self.model.codec_embedding(code0_tensor), pick
            )
            frame = [code0, *residuals[0].tolist()]
            state.frames.append(frame)
            frames.append(frame)
        return frames

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        ids = input_ids.long()
        prompt = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)  # positions holding prompt ids
        generated_inputs: list[tuple[slice, torch.Tensor]] = []
        step_rows: list[StepRow] = []
        for row, (start, end) in enumerate(self._row_segments(ids.shape[0])):
            state = TALKER_BATCH.rows.get(row)
            if state is None or end <= start:
                step_rows.append(StepRow(state, False, None))
                continue
            frames_before = len(state.frames)
            row_positions = positions[start:end].tolist()
            generated = [i for i, p in enumerate(row_positions) if p >= state.prompt_len]
            if generated:  # a suffix of the row: positions increase
                steps = [row_positions[i] - state.prompt_len for i in generated]
                codes0 = ids[start:end][generated].tolist()
                frames = self._generated_inputs(state, codes0, steps)
                where = slice(start + generated[0], start + generated[-1] + 1)
                prompt[where] = False
                generated_inputs.append((where, self._frame_inputs(state, frames, steps)))
            last = row_positions[-1]
            frontier = last == state.prompt_len + len(state.frames) - 1
            new_frame = state.frames[-1] if len(state.frames) > frames_before else None
            step_rows.append(StepRow(state, frontier, new_frame))
        TALKER_BATCH.step = step_rows
        embeds = torch.empty(
            ids.shape[0], self.codec_head.in_features, dtype=self.codec_head.weight.dtype, device=ids.device
        )
        if prompt.any():  # decode steps skip the text path: their inputs come from the frames
            embeds[prompt] = self.embed_prompt_ids(ids[prompt])
        for where, inputs in generated_inputs:
            embeds[where] = inputs
        return self.model(positions, embeds)

    def _frame_inputs(self, state: TalkerRequestState, frames: list[list[int]], steps: list[int]) -> torch.Tensor:
        """Talker inputs of generated positions: 16 code embeddings summed, plus the step's text vector."""
        device = self.codec_head.weight.device
        codes = torch.tensor(frames, dtype=torch.long, device=device)
        trailing = state.spec.trailing_text_ids
        text_ids = torch.tensor(
            [trailing[s] if s < len(trailing) else self.tts_pad_token_id for s in steps],
            dtype=torch.long,
            device=device,
        )
        summed = self.model.codec_embedding(codes[:, 0]) + self.code_predictor.residual_embeddings(codes[:, 1:])
        return summed + self.project_text(text_ids)

    # -- outputs ----------------------------------------------------------------------------

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        codec_logits = self.codec_head(hidden_states)
        logits = torch.full(
            (hidden_states.shape[0], self.vocab), -RESIDUAL_MARK, dtype=codec_logits.dtype, device=codec_logits.device
        )
        logits[:, : self.codec_vocab] = codec_logits
        step = TALKER_BATCH.step if len(TALKER_BATCH.step) == hidden_states.shape[0] else []
        for row, info in enumerate(step):
            if info.state is None:
                continue
            if info.frontier:
                info.state.last_hidden = hidden_states[row].detach().clone()
            if info.new_frame is not None:
                columns = residual_columns(info.new_frame[1:], self.codec_vocab, self.codebook_size)
                logits[row, columns] = RESIDUAL_MARK
        return logits

    # -- weights ----------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load ``talker.*`` tensors of a released checkpoint; returns the names of the parameters loaded.

        The talker LM's q/k/v and gate/up projections are stacked into vLLM's fused
        ``qkv_proj`` / ``gate_up_proj``; ``speaker_encoder.*`` (voice-clone models) is not used.
        """
        stacked = [
            (".self_attn.qkv_proj", ".self_attn.q_proj", "q"),
            (".self_attn.qkv_proj", ".self_attn.k_proj", "k"),
            (".self_attn.qkv_proj", ".self_attn.v_proj", "v"),
            (".mlp.gate_up_proj", ".mlp.gate_proj", 0),
            (".mlp.gate_up_proj", ".mlp.up_proj", 1),
        ]
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if not name.startswith("talker."):
                continue
            name = name.removeprefix("talker.")
            if name.startswith("model.layers."):
                for fused, part, shard in stacked:
                    if part in name:
                        target = name.replace(part, fused)
                        param = params[target]
                        param.weight_loader(param, tensor, shard)
                        loaded.add(target)
                        break
                else:
                    param = params[name]
                    getattr(param, "weight_loader", _default_loader)(param, tensor)
                    loaded.add(name)
                continue
            if name not in params:
                raise KeyError(f"checkpoint tensor talker.{name} has no parameter in the talker model")
            with torch.no_grad():
                params[name].copy_(tensor.to(params[name].dtype))
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} talker tensors, e.g. {missing[:5]}")
        return loaded


def _default_loader(param: torch.Tensor, tensor: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
