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

import bisect
import logging
from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from .code_predictor import Qwen3TTSCodePredictor
from .configuration_qwen3_tts import Qwen3TTSConfig
from .engine_ids import RESIDUAL_MARK, SPEAKER_SLOT, VOICE_SLOTS, engine_vocab_size, residual_column_offsets, voice_base
from .engine_settings import LOGPROBS_MODE
from .talker_requests import LOGITS_PROCESSOR, TALKER_BATCH, StepLayout, TalkerRequestState

logger = logging.getLogger(__name__)


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
    if model_config.logprobs_mode != LOGPROBS_MODE:
        problems.append(
            f"logprobs_mode must be {LOGPROBS_MODE!r} (the residual-code channel), got {model_config.logprobs_mode!r}"
        )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() and not model_config.enforce_eager:
        problems.append(
            "CUDA graphs would replay the talker's forward without its per-request steps (code predictor, frame "
            "state): pass enforce_eager=True (--enforce-eager)"
        )
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        problems.append(
            "async scheduling (vLLM's GPU default) gives the talker output-token lists with -1 placeholders for "
            "tokens not yet resolved, and the talker reads a request's last token to know it finished: pass "
            "async_scheduling=False (--no-async-scheduling)"
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
        self.voice_base = voice_base(self.text_vocab, self.codec_vocab)
        offsets = residual_column_offsets(self.groups, self.codec_vocab, self.codebook_size)
        self.register_buffer("residual_offsets", torch.tensor(offsets, dtype=torch.long), persistent=False)

    # -- inputs -----------------------------------------------------------------------------

    def project_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_prompt_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of encoded prompt ids (``engine_ids``); a voice position gets its text part only (its
        request's voice vector is added by :meth:`_add_voice`)."""
        voice = ids >= self.voice_base
        pair = (ids >= self.text_vocab) & ~voice
        offset = (ids - self.text_vocab).clamp(min=0)
        text_ids = torch.where(pair, offset // self.codec_vocab, ids)
        text_ids = torch.where(voice, (ids - self.voice_base).clamp(min=0) // VOICE_SLOTS, text_ids)
        codec_ids = torch.where(pair, offset % self.codec_vocab, torch.zeros_like(ids))
        embeds = self.project_text(text_ids.clamp(0, self.text_vocab - 1))
        return embeds + self.model.codec_embedding(codec_ids) * pair.unsqueeze(-1).to(embeds.dtype)

    def _add_voice(self, embeds: torch.Tensor, ids: torch.Tensor, starts: list[int], where: torch.Tensor) -> None:
        """Add each voice position's vector (speaker embedding or reference frame) from its request's spec."""
        indices = where.tolist()
        slots = ((ids[where] - self.voice_base) % VOICE_SLOTS).tolist()
        by_row: dict[int, tuple[list[int], list[int]]] = {}
        for index, slot in zip(indices, slots, strict=True):
            row = bisect.bisect_right(starts, index) - 1
            by_row.setdefault(row, ([], []))[0].append(index)
            by_row[row][1].append(slot)
        for row, (rows_indices, row_slots) in by_row.items():
            state = TALKER_BATCH.rows.get(row)
            table = self._voice_table(state) if state is not None else None
            if table is None or max(row_slots) >= table.shape[0]:
                # Only a request made around vllm_omni.entrypoints.speech gets here (it checks every voice):
                # its voice positions keep their text part; the engine and the other requests go on.
                key = state.spec.request_key if state is not None else f"row {row}"
                logger.warning("talker request %s: voice positions without their vectors; text part only", key)
                continue
            at = torch.tensor(rows_indices, dtype=torch.long, device=embeds.device)
            embeds[at] += table[torch.tensor(row_slots, dtype=torch.long, device=table.device)]

    def _voice_table(self, state: TalkerRequestState) -> torch.Tensor | None:
        """``[1 + frames, hidden]``: slot 0 the speaker embedding (zeros without one), slot ``j + 1`` the 16
        codebook embeddings of reference frame ``j`` summed in one reduction (as the official ``sum(1)``);
        made once per request. None if the request's vectors do not fit this model."""
        if state.voice_table is None:
            spec, weight = state.spec, self.codec_head.weight
            try:
                spec.check_voice(weight.shape[1], self.groups, self.codebook_size)
            except ValueError:
                return None
            rows = 1 + len(spec.reference_codes)
            table = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
            if spec.speaker_embedding:
                table[SPEAKER_SLOT] = torch.tensor(spec.speaker_embedding, dtype=weight.dtype, device=weight.device)
            if spec.reference_codes:
                codes = torch.tensor(spec.reference_codes, dtype=torch.long, device=weight.device)
                residual = self.code_predictor.model.codec_embedding
                parts = [self.model.codec_embedding(codes[:, 0])]
                parts += [embedding(codes[:, group + 1]) for group, embedding in enumerate(residual)]
                table[1:] = torch.stack(parts).sum(0)
            state.voice_table = table
        return state.voice_table

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_ids(input_ids.long())

    def _batch_layout(self, num_tokens: int, positions: torch.Tensor) -> tuple[list[int], list[int]]:
        """Row starts (``query_start_loc``) and every token's position, read to the host in one copy."""
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return [], []
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            metadata = metadata[0] if metadata else None
        if not metadata:
            return [], []
        layer_metadata = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
        starts = layer_metadata.query_start_loc
        host = torch.cat((starts.to(positions.dtype), positions[:num_tokens])).tolist()
        return [min(s, num_tokens) for s in host[: starts.numel()]], host[starts.numel() :]

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inputs of every position, then the talker LM. One code-predictor call for the whole step.

        A generated position holds codebook 0 of frame ``j`` of its request. If frame ``j`` is new, the
        code predictor makes its residual codes from the hidden state that chose codebook 0 (kept by
        ``compute_logits``); every new frame of the step, whatever its request, goes through one
        batched :meth:`Qwen3TTSCodePredictor.predict`. Frames known already (a preempted request
        recomputing its positions) are reused as they were made.
        """
        ids = input_ids.long()
        device = ids.device
        starts, host_positions = self._batch_layout(ids.shape[0], positions)
        prompt_index: list[int] = []
        known: list[tuple[int, TalkerRequestState, int]] = []  # (token index, state, frame index)
        new: list[tuple[int, TalkerRequestState, int, int]] = []  # (token index, state, frame index, batch row)
        layout = StepLayout(rows=max(len(starts) - 1, 0))
        for row in range(len(starts) - 1):
            start, end = starts[row], starts[row + 1]
            state = TALKER_BATCH.rows.get(row)
            if state is None or end <= start:
                prompt_index.extend(range(start, end))
                continue
            generated = bisect.bisect_left(host_positions, state.prompt_len, start, end)  # positions increase
            prompt_index.extend(range(start, generated))
            known_frames = made = len(state.frames)
            for index in range(generated, end):
                step = host_positions[index] - state.prompt_len
                if state.failure is not None:  # ended at its next sampling: inputs that harm nobody meanwhile
                    prompt_index.extend(range(index, end))
                    break
                if step < known_frames:
                    known.append((index, state, step))
                elif step == made == known_frames and state.last_hidden is not None:  # one new frame per row
                    new.append((index, state, step, row))
                    made += 1
                else:  # this request's state is inconsistent: it fails, the engine and the others go on
                    state.fail(
                        f"talker request {state.spec.request_key}: frame {step} requested with {len(state.frames)} "
                        "frames known; the request ends here"
                    )
                    prompt_index.extend(range(index, end))
                    break
            if host_positions[end - 1] == state.prompt_len + made - 1:
                layout.frontier.append((row, state))
        prompt_index.extend(range(starts[-1] if starts else 0, ids.shape[0]))  # padding, or a run without rows
        embeds = torch.empty(
            ids.shape[0], self.codec_head.in_features, dtype=self.codec_head.weight.dtype, device=device
        )
        if prompt_index:  # decode steps skip the text path: their inputs come from the frames
            where = torch.tensor(prompt_index, dtype=torch.long, device=device)
            embeds[where] = self.embed_prompt_ids(ids[where])
            voice = ids[where] >= self.voice_base
            if bool(voice.any()):  # a cloned voice's prompt (prefill steps only)
                self._add_voice(embeds, ids, starts, where[voice])
        codes = [torch.stack([state.frames[step] for _, state, step in known])] if known else []
        if new:
            made_codes = self._new_frames(ids, new, layout)
            for frame, (_, state, _, _) in zip(made_codes, new, strict=True):
                state.frames.append(frame)
            codes.append(made_codes)
        generated = known + [(index, state, step) for index, state, step, _ in new]
        if generated:
            where = torch.tensor([index for index, _, _ in generated], dtype=torch.long, device=device)
            embeds[where] = self._frame_inputs(torch.cat(codes), generated)
        TALKER_BATCH.step = layout
        return self.model(positions, embeds)

    def _new_frames(
        self, ids: torch.Tensor, new: list[tuple[int, TalkerRequestState, int, int]], layout: StepLayout
    ) -> torch.Tensor:
        """``int64[n, groups]``: the frames completed in this step, their residuals in one batched call."""
        device, tables = ids.device, TALKER_BATCH.tables
        if tables is None:
            raise RuntimeError("the talker's logits processor was not loaded: see check_engine")
        code0 = ids[torch.tensor([index for index, _, _, _ in new], dtype=torch.long, device=device)]
        rows = torch.tensor([row for _, _, _, row in new], dtype=torch.long, device=device)
        hidden = torch.stack([state.last_hidden for _, state, _, _ in new])
        residuals = self.code_predictor.predict(hidden, self.model.codec_embedding(code0), tables.sampling(rows))
        tables.history[rows, code0] = True  # the repetition-penalty history and frame counts of these rows
        tables.frames[rows] += 1
        layout.new_rows, layout.new_residuals = rows, residuals
        return torch.cat((code0.unsqueeze(1), residuals), dim=1)

    def _frame_inputs(self, codes: torch.Tensor, generated: list[tuple[int, TalkerRequestState, int]]) -> torch.Tensor:
        """Talker inputs of generated positions (token index, state, frame index): the frame's 16 code embeddings
        (``codes [n, 16]``, in the same order) summed, plus the step's text vector."""
        text_ids = []
        for _, state, step in generated:
            trailing = state.spec.trailing_text_ids
            if step >= len(trailing) and state.spec.text_open:
                # Its chunk's max_tokens stops a text stream before a step whose text is unknown: never a pad here.
                state.fail(f"talker request {state.spec.request_key}: step {step} ran before its text arrived")
            text_ids.append(trailing[step] if step < len(trailing) else self.tts_pad_token_id)
        text = torch.tensor(text_ids, dtype=torch.long, device=codes.device)
        summed = self.model.codec_embedding(codes[:, 0]) + self.code_predictor.residual_embeddings(codes[:, 1:])
        return summed + self.project_text(text)

    # -- outputs ----------------------------------------------------------------------------

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The codec head's logits, widened by the residual channel: the 15 columns of each frame completed
        in this step are raised to ``RESIDUAL_MARK`` in its row (``engine_ids``)."""
        codec_logits = self.codec_head(hidden_states)
        logits = torch.full(
            (hidden_states.shape[0], self.vocab), -RESIDUAL_MARK, dtype=codec_logits.dtype, device=codec_logits.device
        )
        logits[:, : self.codec_vocab] = codec_logits
        layout = TALKER_BATCH.step
        if layout.rows != hidden_states.shape[0]:
            return logits
        for row, state in layout.frontier:
            state.last_hidden = hidden_states[row]  # a row of this step's tensor: no copy
        if layout.new_rows is not None:
            logits[layout.new_rows.unsqueeze(1), layout.new_residuals + self.residual_offsets] = RESIDUAL_MARK
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
        self._use_engine_gemm()
        return loaded

    def _use_engine_gemm(self) -> None:
        """Run the plain ``nn.Linear`` layers (code predictor, codec head, text projection) on the GEMM kernels
        vLLM gives its own layers on this platform.

        On CPU that is oneDNN with prepacked weights: at a step's few rows it streams the weights several times
        faster than ``torch.nn.functional.linear`` (measured at the 0.6B sizes: about 45-80 GB/s against 7-16
        for 8-16 rows), and the code predictor reads its weights 15 times a step. Elsewhere the layers stay
        as they are. Called once the weights are loaded (prepacking copies them).
        """
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        for module in self.modules():
            if type(module) is nn.Linear:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                module.forward = _engine_linear(module)


def _engine_linear(module: nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return module.cpu_linear(x, module.weight, module.bias)

    return forward


def _default_loader(param: torch.Tensor, tensor: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
