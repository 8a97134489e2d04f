"""The Qwen3-TTS talker as a vLLM model: text prompt -> codec frames (16 codes per 80 ms).

Registered for the released architecture name ``Qwen3TTSForConditionalGeneration`` by the
``vllm.general_plugins`` entry point (``vllm_omni.plugins:register``); plain vLLM runs it.

* The talker LM is vLLM's own Qwen3 decoder layer stack (paged attention, KV cache). The official
  model applies interleaved multimodal RoPE with three position streams; for speech all three
  streams are the same position, so every rotary frequency sees that position and M-RoPE equals
  1-D RoPE exactly: vLLM's default rotary embedding is used.
* Prompt positions arrive as self-describing ids (``engine_contract``): projected text
  (``text_projection(text_embedding(t))``), optionally plus a codec embedding.
* A generated position holds codebook 0 of frame ``j``. Its input is the sum of the 16 codebook
  embeddings of frame ``j`` plus the ``j``-th streamed text vector (or ``tts_pad``), as the
  official ``Qwen3TTSTalkerForConditionalGeneration.forward``.
* ``compute_logits`` makes each request's next frame whole, in the step whose hidden state picks it:
  codebook 0 with the official rules and sampling, then its residual codes by the code predictor
  from the same hidden state and codebook 0's embedding. The frame is kept per request and leaves
  with its codebook-0 token (the residuals through the widened logits, ``engine_contract``).

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
from vllm.compilation.decorators import support_torch_compile

from .batch_layout import row_starts
from .code_predictor import Qwen3TTSCodePredictor
from .code_predictor_graphs import BUCKETS, BucketedCodePredictor
from .configuration_qwen3_tts import Qwen3TTSConfig
from .engine_contract import (
    MAX_LOGPROBS,
    SPEAKER_SLOT,
    VOICE_SLOTS,
    engine_vocab_size,
    residual_column_offsets,
    voice_base,
    widen_logits,
)
from .engine_settings import engine_problems, on_gpu
from .fused_code_predictor import FusedCodePredictor, Projection, rms_norm
from .logits_processor import codebook0_scores
from .request_state import TalkerRequestState
from .residual_sampler import CODEBOOK0_GROUP
from .talker_batch import StepLayout, talker_batch

logger = logging.getLogger(__name__)


class TalkerEngineError(RuntimeError):
    """The vLLM engine is configured in a way the talker cannot run under; the message says what to set."""


def check_engine(vllm_config) -> None:
    """Refuse engine settings under which the talker's frames would be wrong, in one line naming each fix
    (:func:`~.engine_settings.engine_problems`: the table :func:`~.engine_settings.talker_engine_args` applies)."""
    problems = engine_problems(vllm_config)
    if problems:
        raise TalkerEngineError("Qwen3-TTS talker cannot run with these engine settings: " + "; ".join(problems))


class TextProjection(nn.Module):
    """``talker.text_projection``: Linear -> SiLU -> Linear, text width to talker width."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


@support_torch_compile(dynamic_arg_dims={"positions": 0, "inputs_embeds": 0}, enable_if=lambda vllm_config: on_gpu())
class TalkerLM(nn.Module):
    """``talker.model``: codec/text embeddings, Qwen3 decoder layers on vLLM's attention, final norm.

    Compiled by vLLM on a GPU when the engine compiles (a PIECEWISE CUDA graph mode, ``engine_settings``): its
    forward is the layer stack alone, so piecewise graphs hold no per-request host work. On a CPU it runs
    eagerly (the path this project checks there)."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
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
        self.model = TalkerLM(vllm_config=vllm_config, prefix="model")
        self.text_projection = TextProjection(talker.text_hidden_size, talker.hidden_size)
        self.codec_head = nn.Linear(talker.hidden_size, talker.vocab_size, bias=False)
        self.code_predictor = Qwen3TTSCodePredictor(talker.code_predictor_config, talker.hidden_size)
        self.tts_pad_token_id = config.tts_pad_token_id
        self.voice_base = voice_base(self.text_vocab, self.codec_vocab)
        offsets = residual_column_offsets(self.groups, self.codec_vocab, self.codebook_size)
        self.register_buffer("residual_offsets", torch.tensor(offsets, dtype=torch.long), persistent=False)
        self.cache_config = vllm_config.cache_config  # its block_size splits a step's tokens by row
        self.batch = talker_batch(vllm_config)  # shared with the engine's logits processor
        self.residual_predictor: FusedCodePredictor | BucketedCodePredictor | None = None  # from the loaded weights
        self.max_rows = vllm_config.scheduler_config.max_num_seqs
        self.capture_predictor = bool((vllm_config.additional_config or {}).get("code_predictor_cuda_graphs", True))

    # -- inputs -----------------------------------------------------------------------------

    def project_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_prompt_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of encoded prompt ids (``engine_contract``); a voice position gets its text part only (its
        request's voice vector is added by :meth:`_add_voice`)."""
        voice = ids >= self.voice_base
        pair = (ids >= self.text_vocab) & ~voice
        offset = (ids - self.text_vocab).clamp(min=0)
        text_ids = torch.where(pair, offset // self.codec_vocab, ids)
        text_ids = torch.where(voice, (ids - self.voice_base).clamp(min=0) // VOICE_SLOTS, text_ids)
        codec_ids = torch.where(pair, offset % self.codec_vocab, torch.zeros_like(ids))
        embeds = self.project_text(text_ids.clamp(0, self.text_vocab - 1))
        return embeds + self.model.codec_embedding(codec_ids) * pair.unsqueeze(-1).to(embeds.dtype)

    def _add_voice(self, embeds: torch.Tensor, voice: dict[int, tuple[slice, slice, int]], index: torch.Tensor) -> None:
        """Add each voice position's vector (speaker embedding or reference frame) from its request's spec;
        ``voice[row]``: where that row's voice positions and their slots are in ``index``, and its largest slot."""
        for row, (at, slots, largest) in voice.items():
            state = self.batch.rows.get(row)
            table = self._voice_table(state) if state is not None else None
            if table is None or largest >= table.shape[0]:
                # Only a request made around vllm_omni.entrypoints.generation.speech gets here (it checks every voice):
                # its voice positions keep their text part; the engine and the other requests go on.
                key = state.spec.request_key if state is not None else f"row {row}"
                logger.warning("talker request %s: voice positions without their vectors; text part only", key)
                continue
            embeds[index[at]] += table[index[slots]]

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
                table[1:] = self._frame_sums(torch.tensor(spec.reference_codes, dtype=torch.long, device=weight.device))
            state.voice_table = table
        return state.voice_table

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_prompt_ids(input_ids.long())

    def _step_tokens(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
        """The step's positions, KV slots and ids on the host, in one device-to-host copy. The slots are the
        forward context's (the model runner sets them for every attention backend; -1: padding)."""
        from vllm.forward_context import get_forward_context, is_forward_context_available

        count = ids.shape[0]
        mapping = get_forward_context().slot_mapping if is_forward_context_available() else None
        if isinstance(mapping, list):  # micro-batches: one mapping each (the talker runs without them)
            mapping = mapping[0] if mapping else None
        slots = next(iter(mapping.values()), None) if isinstance(mapping, dict) else None
        if slots is None:
            return [], [], []
        slots = slots[:count]
        host = torch.cat((positions[:count].long(), ids, slots.long())).tolist()
        return host[:count], host[count : 2 * count], host[2 * count :] + [-1] * (count - slots.shape[0])

    def _split_rows(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
        """``(row starts and the real-token count, positions, ids)`` of the step, on the host (:mod:`.batch_layout`);
        no starts when the batch has no rows (profiling and warm-up runs: every position is a prompt position) or
        the tokens cannot be split (then every request of the batch fails, the engine goes on)."""
        rows = len(self.batch.rows)
        if not rows:
            return [], [], []
        host_positions, host_ids, host_slots = self._step_tokens(ids, positions)
        if sorted(self.batch.rows) != list(range(rows)):
            self._fail_step(f"the batch rows {sorted(self.batch.rows)[:8]} are not 0..{rows - 1}")
        elif not host_slots:
            self._fail_step("the engine gave no KV slot mapping to split the step's tokens by row")
        else:
            starts = row_starts(host_positions, host_slots, rows, self.cache_config.block_size)
            if starts is not None:
                return starts, host_positions, host_ids
            self._fail_step("the step's tokens could not be split into its rows")
        return [], host_positions, host_ids

    def _fail_step(self, message: str) -> None:
        for state in self.batch.rows.values():
            state.fail(f"talker request {state.spec.request_key}: {message}; the request ends here")

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inputs of every position, then the talker LM.

        A generated position holds codebook 0 of frame ``j`` of its request; the whole frame was made by
        :meth:`compute_logits` in the step that sampled it, so its input is known here (a preempted request
        recomputing its positions reuses its frames as they were made).

        The step reads the device once (:meth:`_step_tokens`) and sends its host-side indices in one copy; a
        request whose state does not fit the step fails alone (:meth:`TalkerRequestState.fail`).
        """
        ids = input_ids.long()
        batch, count = self.batch, ids.shape[0]
        starts, host_positions, host_ids = self._split_rows(ids, positions)
        prompt_index: list[int] = []
        generated: list[tuple[int, TalkerRequestState, int]] = []  # (token index, state, frame index)
        layout = StepLayout(rows=max(len(starts) - 1, 0))
        for row in range(len(starts) - 1):
            start, end = starts[row], starts[row + 1]
            state = batch.rows[row]
            first = bisect.bisect_left(host_positions, state.prompt_len, start, end)  # positions increase
            prompt_index.extend(range(start, first))
            for index in range(first, end):
                step = host_positions[index] - state.prompt_len
                if state.failure is not None:  # ended at its next sampling: inputs that harm nobody meanwhile
                    prompt_index.extend(range(index, end))
                    break
                if step >= len(state.frames):  # this request's state is inconsistent: it fails, the others go on
                    state.fail(
                        f"talker request {state.spec.request_key}: frame {step} requested with {len(state.frames)} "
                        "frames known; the request ends here"
                    )
                    prompt_index.extend(range(index, end))
                    break
                generated.append((index, state, step))
            if host_positions[end - 1] == state.prompt_len + len(state.frames) - 1:
                layout.frontier.append((row, state))
        prompt_index.extend(range(starts[-1] if starts else 0, count))  # padding, or a step without rows

        # Every index the step needs on the device, sent in one copy.
        pack = _HostIndices()
        prompt_at = pack.add(prompt_index)
        voice: dict[int, tuple[slice, slice, int]] = {}
        if starts and prompt_index:  # a cloned voice's prompt positions (prefill steps only)
            by_row: dict[int, tuple[list[int], list[int]]] = {}
            for index in prompt_index:
                if index < starts[-1] and host_ids[index] >= self.voice_base:
                    row = bisect.bisect_right(starts, index) - 1
                    at, slots = by_row.setdefault(row, ([], []))
                    at.append(index)
                    slots.append((host_ids[index] - self.voice_base) % VOICE_SLOTS)
            for row, (at, slots) in by_row.items():
                voice[row] = (pack.add(at), pack.add(slots), max(slots))
        generated_at = pack.add([index for index, _, _ in generated])
        text_at = pack.add(self._frame_text_ids(generated))
        index = pack.to(ids.device)

        embeds = torch.empty(count, self.codec_head.in_features, dtype=self.codec_head.weight.dtype, device=ids.device)
        if prompt_index:  # decode steps skip the text path: their inputs come from the frames
            where = index[prompt_at]
            embeds[where] = self.embed_prompt_ids(ids[where])
            self._add_voice(embeds, voice, index)
        if generated:
            codes = torch.stack([state.frames[step] for _, state, step in generated])
            embeds[index[generated_at]] = self._frame_inputs(codes, index[text_at])
        batch.step = layout
        return self.model(positions, embeds)

    def _frame_text_ids(self, generated: list[tuple[int, TalkerRequestState, int]]) -> list[int]:
        """The text id each generated position adds: its step's streamed text id, or ``tts_pad`` after the text."""
        text_ids = []
        for _, state, step in generated:
            trailing = state.spec.trailing_text_ids
            if step >= len(trailing) and state.spec.text_open:
                # Its chunk's max_tokens stops a text stream before a step whose text is unknown: never a pad here.
                state.fail(f"talker request {state.spec.request_key}: step {step} ran before its text arrived")
            text_ids.append(trailing[step] if step < len(trailing) else self.tts_pad_token_id)
        return text_ids

    def _frame_inputs(self, codes: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """Talker inputs of generated positions: each frame's 16 code embeddings (``codes [n, 16]``) summed, plus
        its step's text vector (``text_ids int64[n]``, in the same order)."""
        return self._frame_sums(codes) + self.project_text(text_ids)

    def _frame_sums(self, codes: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]``: each frame's 16 code embeddings (``codes [n, 16]``) summed in one reduction, as the
        official ``torch.cat(...).sum(1)`` (one rounding in bf16, not fifteen)."""
        residual = self.code_predictor.model.codec_embedding
        parts = [self.model.codec_embedding(codes[:, 0])]
        parts += [embedding(codes[:, group + 1]) for group, embedding in enumerate(residual)]
        return torch.stack(parts, dim=1).sum(1)

    # -- outputs ----------------------------------------------------------------------------

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The codec head's logits, widened by the residual channel (``engine_contract.widen_logits``), with the
        next frame of every request whose newest position this step ran made here, whole.

        For those rows codebook 0 is picked as the official model picks it (:func:`codebook0_scores`, then
        greedy or sampled with :class:`~.residual_sampler.ResidualSampling`), the code predictor makes the
        residual codes from the same hidden state, and the row's logits keep only that codebook-0 id (every
        other codec id at -inf: vLLM's sampler can take no other) and raise the 15 residual columns, so the
        frame leaves the engine with the token that starts it. Other rows (a prefill chunk that samples nothing
        the request keeps, a request that failed) keep the codec head's logits.
        """
        codec = self.codec_head(hidden_states)
        layout, tables = self.batch.step, self.batch.tables
        live = [(row, state) for row, state in layout.frontier if state.failure is None]
        if layout.rows != hidden_states.shape[0] or not live or tables is None:
            return widen_logits(codec, self.vocab, None, None, self.residual_offsets)
        rows = torch.tensor([row for row, _ in live], dtype=torch.long, device=codec.device)
        scores = codebook0_scores(codec[rows].float(), tables, rows, self.codec_vocab, self.batch.eos_token_id)
        code0 = tables.code0_sampling(rows, all(s.spec.greedy for _, s in live)).pick(CODEBOOK0_GROUP, scores)
        sampling = tables.sampling(rows, all(s.spec.subtalker_greedy for _, s in live))
        residuals = self._predictor().predict(hidden_states[rows], self.model.codec_embedding(code0), sampling)
        tables.history[rows, code0] = True  # the repetition-penalty history and frame counts of these rows
        tables.frames[rows] += 1
        frames = torch.cat((code0.unsqueeze(1), residuals), dim=1)
        for frame, (_, state) in zip(frames, live, strict=True):
            state.frames.append(frame)  # a row of this step's tensor; an EOS "frame" ends its request unused
        logits = widen_logits(codec, self.vocab, rows, residuals, self.residual_offsets)
        logits[rows, : self.codec_vocab] = float("-inf")
        logits[rows, code0] = 0.0
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
                if params[name].numel() == 0:  # a projection the fused predictor released: weights loaded again
                    params[name].data = torch.empty(tensor.shape, dtype=params[name].dtype, device=params[name].device)
                params[name].copy_(tensor.to(params[name].dtype))
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} talker tensors, e.g. {missing[:5]}")
        self._use_engine_gemm()
        self.residual_predictor = None
        self._predictor()
        self._warm_logprobs()
        return loaded

    def _predictor(self) -> FusedCodePredictor | BucketedCodePredictor:
        """The fused code predictor, made from the weights on first use (:meth:`load_weights` makes it; an engine
        whose weights came another way, such as ``load_format="dummy"``, makes it at its first step)."""
        if self.residual_predictor is None:
            fused = FusedCodePredictor(self.code_predictor, gemm=engine_projection(), norm=engine_rms_norm())
            _release_projections(self.code_predictor)
            self.residual_predictor = self._warm(fused)
        return self.residual_predictor

    def _warm_logprobs(self) -> None:
        """Compile vLLM's logprobs gather now: it is ``torch.compile``d on first use (``batched_count_greater_than``,
        batch size unbacked: one compile for every batch), which the engine's warm-up never reaches (it asks for no
        logprobs) and every talker request does (the residual channel). Measured at the 0.6B sizes on 2 cores: the
        first request after start-up waited 4.2 s for its first frame against 0.5 s for the next. Compiled under
        the default dtype the engine serves with (float32; vLLM loads the weights under the model's dtype, and the
        compiled code is guarded on it)."""
        from vllm.v1.sample.sampler import Sampler

        device = self.codec_head.weight.device
        loading_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            logits = torch.zeros(2, self.vocab, dtype=torch.float32, device=device)
            with torch.inference_mode():
                Sampler.gather_logprobs(
                    Sampler.compute_logprobs(logits), MAX_LOGPROBS, torch.zeros(2, dtype=torch.int64, device=device)
                )
        finally:
            torch.set_default_dtype(loading_dtype)

    def _warm(self, fused: FusedCodePredictor) -> FusedCodePredictor | BucketedCodePredictor:
        """The code predictor ready before the first request: on CUDA every batch bucket captured in CUDA graphs
        (greedy and mixed, one memory pool; eager buckets if capture fails, with a warning); elsewhere one greedy
        and one mixed pass at the batch sizes a step most often has, so the GEMM kernels a step picks exist."""
        device = fused.device
        if device.type == "cuda":
            largest = min(self.max_rows, BUCKETS[-1])  # batches beyond it run eagerly, padded to its multiples
            bucketed = BucketedCodePredictor(fused, tuple(sorted({*(b for b in BUCKETS if b < largest), largest})))
            if self.capture_predictor:
                try:
                    bucketed.capture_all()
                except RuntimeError as error:  # the eager buckets compute the same codes
                    bucketed.graphs.clear()
                    logger.warning("code predictor CUDA graph capture failed, running it eagerly: %s", error)
            return bucketed
        for rows in sorted({1, min(8, self.max_rows)}):
            space = fused.workspace(rows)  # zeros: greedy rows on zero inputs
            fused.run(space, all_greedy=True)
            fused.run(space, all_greedy=False)
        return fused

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

        for name, module in self.named_modules():
            if type(module) is nn.Linear and not name.startswith("code_predictor."):  # the fused predictor's own
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                module.forward = _engine_linear(module)


class _HostIndices:
    """Host-side int64 index lists of one step, sent to the device in one copy (pinned and asynchronous on a GPU)."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def add(self, values: Iterable[int]) -> slice:
        """Append ``values``; returns where they will be in :meth:`to`'s tensor."""
        start = len(self.values)
        self.values.extend(values)
        return slice(start, len(self.values))

    def to(self, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            return torch.tensor(self.values, dtype=torch.long)
        return torch.tensor(self.values, dtype=torch.long).pin_memory().to(device, non_blocking=True)


class _OneDNNProjection(Projection):
    """A projection on vLLM's CPU GEMM (oneDNN, weights prepacked at its creation), written into a given buffer."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        from vllm import _custom_ops as ops

        self.handler, self.bias = ops.create_onednn_mm(weight.t(), 32), bias

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        torch.ops._C.onednn_mm(out, x, self.bias, self.handler.handler_tensor)

    def add_into(self, x: torch.Tensor, target: torch.Tensor, scratch: torch.Tensor) -> None:
        self.into(x, scratch)
        target.add_(scratch)


def engine_projection():
    """The projection the fused code predictor uses on this platform: vLLM's oneDNN GEMM on a CPU that has it
    (streams a step's few rows several times faster than ``torch.mm``), plain torch elsewhere."""
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and getattr(ops, "_supports_onednn", False):
        return _OneDNNProjection
    return Projection


def engine_rms_norm():
    """vLLM's fused RMSNorm kernel for the fused code predictor on a CPU (a weight of ones; about 4 us against 19 for
    ``aten._fused_rms_norm``'s CPU composite at 8 x 1024), or None (the default) elsewhere. vLLM's CPU kernel reads
    its input as contiguous rows: a strided input (the q/k heads inside the q/k/v buffer) takes the default."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or not hasattr(torch.ops._C, "rms_norm"):
        return None
    ones: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def norm(x: torch.Tensor, eps: float) -> torch.Tensor:
        if not x.is_contiguous():
            return rms_norm(x, eps)
        key = (x.shape[-1], x.dtype)
        weight = ones.get(key)
        if weight is None:
            weight = ones[key] = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, weight, eps)
        return out

    return norm


def _release_projections(predictor: Qwen3TTSCodePredictor) -> None:
    """Free the unfused predictor's projection weights (the fused one holds its own); its embeddings stay (the
    talker's frame inputs read them)."""
    for module in (*predictor.model.layers.modules(), *predictor.lm_head, predictor.small_to_mtp_projection):
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)


def _engine_linear(module: nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return module.cpu_linear(x, module.weight, module.bias)

    return forward


def _default_loader(param: torch.Tensor, tensor: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
