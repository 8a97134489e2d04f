"""One utterance whose text arrives while it is spoken: a text stream fed into one running talker request.

The talker's streamed-text layout (``non_streaming_mode=False``) adds text token ``j + 1`` to the input of codec
step ``j``; a step needs only the text up to its own row. So the request runs while its rows are known and is
**held** at the first step whose text has not arrived: it is a vLLM streaming-input session (``AsyncLLM.generate``
with an async generator of ``StreamingInput``, one resumable request, its KV cache kept), and each chunk of the
session runs exactly the steps whose text is known:

* chunk 1: the prompt (built once the text fills it: the first text token; in context, the reference frames'
  positions), ``max_tokens`` = the tokens the known text allows (one more than the trailing text ids known);
* a chunk ends at its ``max_tokens`` and the request pauses (not scheduled: the other requests keep stepping).
  vLLM drops the last sampled token when a chunk ends, so the next chunk's one prompt token is that token again;
  it starts once the previous chunk has ended and more text is known, naming every trailing text id known so far
  in the talker spec (``text_open`` while more may come, ``tokens_before`` to check it continues the request);
* when the text ends, ``tts_eos`` joins the trailing text and the last chunk runs to EOS or the frame budget.

Tokens are committed by :class:`~vllm_omni.model_executor.models.qwen3_tts.text_stream.IncrementalTokenizer`
(exactly the whole text's tokens), so greedy frames equal the whole text's in the streamed layout whatever the
arrival schedule; the residual sampling is counter-based and codebook 0's seeded generator draws once per token
either way, so seeded sampling is equal too. The cost of a held step: the frame whose residuals wait for the next
step (its codebook 0 is sampled, its 15 residual codes come with the next step) is sent when the next text token
arrives, one frame (80 ms) behind the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import numpy as np

from vllm_omni.model_executor.models.qwen3_tts.engine_contract import TalkerRequestSpec, residual_logprobs
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import ROLE_TOKENS, SpeechPrompt, SpeechRequestError
from vllm_omni.model_executor.models.qwen3_tts.text_stream import IncrementalTokenizer

MAX_PIECE_CHARS = 1 << 16  # one piece at most (a server applies its own, smaller, limits first)


class StreamedText:
    """Pieces of one utterance's text -> committed token ids, and the prompt and trailing text they allow."""

    def __init__(self, generator: Any, request: Any, voice: Any) -> None:
        self.prompts = generator.prompts
        self.request, self.voice = request, voice
        self.tokens = IncrementalTokenizer(self.prompts.tokenizer, self.prompts.lock)
        self.complete = False
        self.changed = asyncio.Event()
        self.error: BaseException | None = None
        self.max_chars = generator.max_model_len * 16  # far more text than the engine has positions for

    def add(self, piece: Any) -> None:
        if not isinstance(piece, str):
            raise SpeechRequestError(f"a text piece must be a str, got {type(piece).__name__}")
        if len(piece) > MAX_PIECE_CHARS or len(self.tokens.text) + len(piece) > self.max_chars:
            raise SpeechRequestError(
                f"the text grew past {self.max_chars} characters (a piece of at most {MAX_PIECE_CHARS}): "
                "more than this engine can speak in one request"
            )
        if self.tokens.add(piece):
            self.changed.set()

    def finish(self) -> None:
        self.tokens.finish()
        self.complete = True
        self.changed.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.changed.set()

    def prompt(self) -> SpeechPrompt | None:
        """The prompt and the trailing text known now (None: not enough text for the prompt yet)."""
        role, text_ids = self.tokens.committed[:ROLE_TOKENS], self.tokens.text_ids
        if len(role) < ROLE_TOKENS:
            return None
        r = self.request
        return self.prompts.assemble(
            role, text_ids, r.speaker, r.language, r.instruct, False, self.voice, complete=self.complete
        )

    async def wait(self, timeout: float | None) -> None:
        """Until more text is committed, the text ends or fails (raised here); ``timeout``: seconds without."""
        if self.error is not None:
            raise self.error
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            raise SpeechRequestError(f"no text arrived for {timeout:g} s while the talker waited for it") from None
        if self.error is not None:
            raise self.error


@dataclasses.dataclass
class SessionProgress:
    """What the engine has sampled in the session so far, seen from its outputs."""

    sampled: int = 0  # codebook-0 tokens, every chunk
    last_token: int | None = None
    ended: bool = False  # EOS sampled, or the frame budget used
    budget: int | None = None  # talker steps in all (max_frames + 1), once the first chunk is made
    chunk_done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


async def stream_text(
    generator: Any,
    request: Any,
    pieces: AsyncIterable[str],
    request_id: str,
    text_timeout_s: float | None = None,
) -> AsyncIterator[np.ndarray]:
    """See ``AsyncCodecFrameGenerator.stream_text`` (``generator``; ``request``: a ``SpeechRequest``). As for any
    request, ``max_frames`` caps the utterance: text past it is not spoken (as the official ``max_new_tokens``)."""
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    if request.text is not None:
        raise SpeechRequestError("stream_text takes its text from `pieces`: set the request's text to None")
    if request.non_streaming_mode:
        raise SpeechRequestError("text that arrives in pieces is spoken in the streamed-text layout only")
    voice = await asyncio.to_thread(generator.voice_prompt, request)
    generator.prompts.check_voice_fields(request.speaker, request.instruct, voice)
    text = StreamedText(generator, request, voice)
    progress = SessionProgress()

    async def read_pieces() -> None:
        try:
            async for piece in pieces:
                text.add(piece)
            text.finish()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # the session's error: raised to the consumer through the engine
            text.fail(error)

    async def chunks() -> AsyncIterator[Any]:
        prompt = text.prompt()
        while prompt is None:
            await text.wait(text_timeout_s)
            prompt = text.prompt()
        first = generator.engine_request(request, prompt, request_id, text_open=not text.complete)
        params = first.sampling_params
        params.output_kind = RequestOutputKind.DELTA
        budget = progress.budget = params.max_tokens  # max_frames + 1 talker steps in all
        spec = TalkerRequestSpec.from_extra_args(params.extra_args)

        def allowed(known: SpeechPrompt) -> int:
            return budget if text.complete else min(budget, len(known.trailing_text_ids) + 1)

        params.max_tokens = allowed(prompt)
        yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=first.prompt_ids), sampling_params=params)
        while not text.complete or spec.text_open:
            await progress.chunk_done.wait()
            progress.chunk_done.clear()
            if progress.ended:
                return
            if text.error is not None:  # the text failed while the chunk ran: no chunk after it
                raise text.error
            known = text.prompt()
            while allowed(known) <= progress.sampled:
                await text.wait(text_timeout_s)
                known = text.prompt()
            spec = dataclasses.replace(
                spec,
                trailing_text_ids=tuple(known.trailing_text_ids),
                text_open=not text.complete,
                tokens_before=progress.sampled,
            )
            params = params.clone()
            params.max_tokens = allowed(known) - progress.sampled
            params.extra_args = spec.to_extra_args()
            chunk = TokensPrompt(prompt_token_ids=[progress.last_token])
            yield StreamingInput(prompt=chunk, sampling_params=params)

    reader = asyncio.create_task(read_pieces())
    assembler = generator.assembler()
    groups = generator.config.talker_config.num_code_groups
    eos = generator.config.talker_config.codec_eos_token_id
    try:
        outputs = generator.engine.generate(chunks(), _first_params(generator), request_id)
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                completion = output.outputs[0]
                if completion.token_ids:
                    progress.sampled += len(completion.token_ids)
                    progress.last_token = completion.token_ids[-1]
                frames = assembler.feed(completion.token_ids, completion.logprobs)
                if completion.finish_reason is not None and not output.finished:
                    ended = assembler.ended or progress.last_token == eos
                    progress.ended = ended or progress.sampled >= progress.budget
                    progress.chunk_done.set()
                if frames:
                    yield np.asarray(frames, dtype=np.int64).reshape(-1, groups)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


def _first_params(generator: Any) -> Any:
    """The session-level sampling parameters ``AsyncLLM.generate`` validates (each chunk brings its own)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    key = f"session-{time.monotonic_ns()}"
    spec = TalkerRequestSpec(request_key=key, trailing_text_ids=(), text_open=True)
    return SamplingParams(
        max_tokens=1,
        output_kind=RequestOutputKind.DELTA,
        logprobs=residual_logprobs(generator.config.talker_config.num_code_groups),
        detokenize=False,
        extra_args=spec.to_extra_args(),
    )
