"""One utterance whose text arrives while it is spoken: a text stream fed into a running talker request.

The talker's streamed-text layout (``non_streaming_mode=False``) adds text token ``j + 1`` to the input of codec
step ``j``; a step needs only the text up to its own row, and the model makes frame ``j`` whole in the step that
samples it. So the request runs while its rows are known and is **held** at the first step whose text has not
arrived: it is a vLLM streaming-input session (``AsyncLLM.generate`` with an async generator of
``StreamingInput``, one resumable request, its KV cache kept), and each chunk of the session runs exactly the
steps whose text is known:

* chunk 1: the prompt (built once the text fills it: the first text token; in context, the reference frames'
  positions), ``max_tokens`` = the frames the known text allows (one more than the trailing text ids known);
* a chunk ends at its ``max_tokens`` and the request pauses (not scheduled: the other requests keep stepping).
  vLLM drops the last sampled token when a chunk ends, so the next chunk's one prompt token is that token again;
  it starts once more text is known and names only the trailing text ids added since the chunk before
  (``TalkerRequestSpec.next_chunk``);
* when the text ends, ``tts_eos`` joins the trailing text and the last chunk runs to EOS or the frame budget.

**A paused session costs the others nothing they need** (:class:`StreamHolds`). vLLM keeps a paused session's KV
blocks and its request slot, and never preempts it; a resumed session that finds no free block stops the
scheduler's waiting queue. So a session keeps its KV while paused only within the engine's hold bounds (at most
half the request slots and half the KV blocks held by paused sessions, each pause at most ``hold_s``); past them
it is **released**: its request ends (the KV freed) and, once more text arrives, the stream resumes as a new
request whose prompt is the old prompt followed by its frames' codebook-0 ids, and the worker recomputes those
positions from the frames it is given (``TalkerRequestSpec.resume_frames``), exactly. A chunk that is not
scheduled within ``chunk_deadline_s`` is released the same way.

While the talker is held for text, the frames iterator yields an empty batch: every frame the known text allows
has been sent, and a batcher holding frames for a fuller message should send them now.

Tokens are committed by :class:`~vllm_omni.model_executor.models.qwen3_tts.text_stream.IncrementalTokenizer`
(exactly the whole text's tokens), so greedy frames equal the whole text's in the streamed layout whatever the
arrival schedule and however often the stream is released; sampling is counter-based per frame (seed, frame
index), so seeded sampling is equal too.

:class:`~.stream_report.StreamReport` says how the utterance went: the frames sent, per frame the characters of
the text its step had read (what was sent to the talker, not an acoustic alignment), and how it ended
(:data:`~.stream_report.ENDINGS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import numpy as np

from vllm_omni.model_executor.models.qwen3_tts.engine_contract import TalkerRequestSpec, residual_logprobs
from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import ROLE_TOKENS, SpeechPrompt, SpeechRequestError
from vllm_omni.model_executor.models.qwen3_tts.text_stream import IncrementalTokenizer

from .stream_report import FLUSH, StreamReport, TalkerFailure

MAX_PIECE_CHARS = 1 << 16  # one piece at most (a server applies its own, smaller, limits first)
HOLD_S = 2.0  # how long a paused session keeps its KV cache before it is released (within the bounds)
# The uncommitted end of a streamed text (one word so far) is tokenized again with every piece: past this many
# characters it is committed as it stands (a flush), so a run without spaces is never quadratic.
MAX_PENDING_CHARS = 1024
CHUNK_DEADLINE_S = 30.0  # a held session's next chunk not scheduled by then is released and resubmitted


class StreamHolds:
    """The paused text streams of one engine that keep their KV cache, bounded so they never take what other
    requests need: at most ``max_sessions`` (vLLM counts a paused session as running when it admits requests)
    and ``max_blocks`` KV blocks in all, each for at most ``hold_s`` seconds."""

    def __init__(self, max_sessions: int, max_blocks: int, block_size: int, hold_s: float = HOLD_S) -> None:
        self.max_sessions, self.max_blocks, self.block_size, self.hold_s = max_sessions, max_blocks, block_size, hold_s
        self.chunk_deadline_s = CHUNK_DEADLINE_S
        self.held: dict[object, int] = {}

    @classmethod
    def for_engine(cls, vllm_config: Any) -> StreamHolds:
        """Half the engine's request slots and half its KV blocks (vLLM reserves one block of its count)."""
        cache, scheduler = vllm_config.cache_config, vllm_config.scheduler_config
        blocks = max((cache.num_gpu_blocks or 0) - 1, 0)
        return cls(scheduler.max_num_seqs // 2, blocks // 2, cache.block_size)  # one slot: never held

    def share(self, processes: int) -> None:
        """This engine is fed by ``processes`` API server processes, each with its own holds: take an equal part."""
        self.max_sessions //= max(processes, 1)
        self.max_blocks //= max(processes, 1)

    def hold(self, session: object, tokens: int) -> bool:
        """Whether ``session``, pausing with ``tokens`` in the KV cache, may keep them (then :meth:`release`)."""
        blocks = math.ceil(tokens / self.block_size)
        if len(self.held) >= self.max_sessions or sum(self.held.values()) + blocks > self.max_blocks:
            return False
        self.held[session] = blocks
        return True

    def release(self, session: object) -> None:
        self.held.pop(session, None)


class StreamedText:
    """Pieces of one utterance's text -> committed token ids, and the prompt and trailing text they allow."""

    def __init__(self, generator: Any, request: Any, voice: Any, timeout_s: float | None) -> None:
        self.prompts = generator.prompts
        self.request, self.voice, self.timeout_s = request, voice, timeout_s
        # Worked on a thread, one operation at a time; the event loop reads only the snapshot below, which it takes
        # itself when an operation has ended (a thread's half-done commit is never seen).
        self.tokens = IncrementalTokenizer(self.prompts.tokenizer, self.prompts.lock)
        self.committed: list[int] = list(self.tokens.committed)  # the role's ids, then the text's, as committed
        self.text_chars = 0  # the characters received
        self.id_chars: list[int] = []  # per committed text id: the characters committed with it
        self.complete = False
        self.changed = asyncio.Event()
        self.error: BaseException | None = None
        self.arrived = time.monotonic()  # the last piece (the text timeout counts from it ...)
        self.waiting_since: float | None = None  # (... or from when the talker began waiting, if later)
        self.max_chars = generator.max_model_len * 16  # far more text than the engine has positions for

    async def add(self, piece: Any) -> None:
        """Take one piece: tokenized on a worker thread (never on the event loop), its committed ids recorded. A
        pending word past :data:`MAX_PENDING_CHARS` (no space or punctuation in that much text) is committed as it
        stands, as a client's flush would: each piece then costs at most that much tokenizing, not the whole run
        again."""
        if not isinstance(piece, str):
            raise SpeechRequestError(f"a text piece must be a str, got {type(piece).__name__}")
        if len(piece) > MAX_PIECE_CHARS or self.text_chars + len(piece) > self.max_chars:
            raise SpeechRequestError(
                f"the text grew past {self.max_chars} characters (a piece of at most {MAX_PIECE_CHARS}): "
                "more than this engine can speak in one request"
            )
        self.arrived = time.monotonic()
        committed = await asyncio.to_thread(self._take, piece)
        if self._commit(committed):
            self.changed.set()

    def _take(self, piece: str) -> list[int]:
        ids = self.tokens.add(piece)
        if len(self.tokens.pending) > MAX_PENDING_CHARS:
            ids += self.tokens.flush()
        return ids

    async def flush(self) -> None:
        """The client's flush: the pending word committed as it stands (``IncrementalTokenizer.flush``)."""
        if self._commit(await asyncio.to_thread(self.tokens.flush)):
            self.changed.set()

    async def finish(self) -> None:
        self._commit(await asyncio.to_thread(self.tokens.finish))
        self.complete = True
        self.changed.set()

    def _commit(self, ids: list[int]) -> list[int]:
        """After an operation on the tokenizer (on the loop, none running): the snapshot the loop reads."""
        tokens = self.tokens
        if ids:
            self.waiting_since = None  # text to speak: the talker no longer waits
        chars = len(tokens.text) if tokens.finished else max(len(tokens.text) - len(tokens.pending), 0)
        self.id_chars += [chars] * len(ids)
        self.committed += tokens.committed[len(self.committed) :]  # it only grows (finish checks the prefix)
        self.text_chars = len(tokens.text)
        return ids

    @property
    def text_ids(self) -> list[int]:
        """The text's committed token ids (after the role)."""
        return self.committed[ROLE_TOKENS:]

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.changed.set()

    def prompt(self) -> SpeechPrompt | None:
        """The prompt and the trailing text known now (None: not enough text for the prompt yet)."""
        role, text_ids = self.committed[:ROLE_TOKENS], self.text_ids
        if len(role) < ROLE_TOKENS:
            return None
        r = self.request
        return self.prompts.assemble(
            role, text_ids, r.speaker, r.language, r.instruct, False, self.voice, complete=self.complete
        )

    async def wait(self, hold_s: float | None = None) -> bool:
        """Until more text is committed or the text ends (True), ``hold_s`` passes (False), or the text fails
        (raised here). The text timeout counts from the later of the last piece received (committed or not) and
        the moment the talker began waiting for text (a talker still speaking what came earlier waits for none)."""
        if self.error is not None:
            raise self.error
        self.changed.clear()
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        hold_until = None if hold_s is None else time.monotonic() + hold_s
        while True:
            now = time.monotonic()
            limits = [hold_until] if hold_until is not None else []
            timeout_at = None if self.timeout_s is None else max(self.arrived, self.waiting_since) + self.timeout_s
            if timeout_at is not None:
                limits.append(timeout_at)
            try:
                await asyncio.wait_for(self.changed.wait(), min(limits) - now if limits else None)
                break
            except TimeoutError:
                now = time.monotonic()
                if timeout_at is not None and now >= timeout_at:
                    raise SpeechRequestError(
                        f"no text arrived for {self.timeout_s:g} s while the talker waited for it"
                    ) from None
                if hold_until is not None and now >= hold_until:
                    return False
        if self.error is not None:
            raise self.error
        return True


class TextSession:
    """The engine requests of one streamed-text utterance: one streaming-input session, and a new one each time
    the stream is released while it waits for text (see the module docstring)."""

    def __init__(self, generator: Any, request: Any, text: StreamedText, report: StreamReport, request_id: str):
        self.generator, self.request, self.text, self.report = generator, request, text, report
        self.request_id = request_id
        self.holds: StreamHolds = generator.stream_holds
        self.groups = generator.config.talker_config.num_code_groups
        self.frames: list[list[int]] = []  # every frame made, 16 codes each
        self.sampled = 0  # codebook-0 tokens sampled, every request and chunk
        self.last_token: int | None = None
        self.ended = False  # EOS, the budget, or a failure: no request after this one
        self.released = False

    def trailing(self, start: int = 0) -> list[int]:
        """The trailing text ids known now, from index ``start``: the first prompt's reference text still trailing
        (in context), the text's ids past the prompt, then ``tts_eos`` once the text is complete. Built from the
        committed ids directly: a chunk costs what it adds, not the whole text again."""
        lead, committed = self.lead, self.text.committed
        ids = lead[start:] + committed[ROLE_TOKENS + max(self.held_ids, 0) + max(start - len(lead), 0) :]
        if self.trails_eos() and start < self.known():
            ids.append(self.tts_eos)
        return ids

    def trails_eos(self) -> bool:
        """Whether ``tts_eos`` is a trailing text id: the text is complete, and the prompt does not hold it (a short
        text cloned in context can fit the prompt whole, ``tts_eos`` included)."""
        return self.text.complete and not self.eos_in_prompt

    def known(self) -> int:
        """How many trailing text ids are known now."""
        text_ids = len(self.text.committed) - ROLE_TOKENS
        return len(self.lead) + max(text_ids - max(self.held_ids, 0), 0) + (1 if self.trails_eos() else 0)

    def allowed(self) -> int:
        """The talker steps the text known now allows, within the budget."""
        return self.budget if self.text.complete else min(self.budget, self.known() + 1)

    async def run(self) -> AsyncIterator[np.ndarray]:
        text = self.text
        prompt = text.prompt()
        while prompt is None:
            await text.wait()
            prompt = text.prompt()
        first = self.generator.engine_request(self.request, prompt, self.request_id, text_open=not text.complete)
        self.params = first.sampling_params
        self.budget = self.params.max_tokens  # max_frames talker steps in all
        self.spec = TalkerRequestSpec.from_extra_args(self.params.extra_args)
        self.prompt_ids = list(first.prompt_ids)
        # Text ids the prompt holds (negative: reference text still trails): frame j has read `held + j` of them.
        # tts_eos, once the text is complete, is the last trailing id, or in the prompt when nothing trails.
        trailing = prompt.trailing_text_ids
        self.eos_in_prompt = text.complete and not trailing
        self.held_ids = len(text.text_ids) - (len(trailing) - (1 if text.complete and trailing else 0))
        self.lead = list(prompt.trailing_text_ids[: max(-self.held_ids, 0)])
        self.tts_eos = self.generator.config.tts_eos_token_id
        while True:
            async with contextlib.aclosing(self._request()) as made:  # closing the stream aborts its request now
                async for frames in made:
                    yield frames
            if self.ended:
                return
            self.report.releases += 1
            while self.allowed() <= self.sampled:  # released while waiting: the engine holds nothing
                await text.wait()

    async def _request(self) -> AsyncIterator[np.ndarray]:
        """One engine request: the prompt (and the frames made before, if resumed), then a chunk per text."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        text, holds = self.text, self.holds
        key = f"{self.request_id}-{uuid.uuid4().hex[:12]}"  # one talker state per request, never shared
        chunk_done = asyncio.Event()
        clock = ChunkClock()
        self.released = False
        prompt_ids = self.prompt_ids + [frame[0] for frame in self.frames]
        held_before = len(self.frames)

        async def chunks() -> AsyncIterator[Any]:
            # The text known now, and the steps it allows, taken together (text may arrive at any await).
            last = dataclasses.replace(
                self.spec,
                request_key=key,
                trailing_text_ids=tuple(self.trailing()),
                text_open=not text.complete,
                resume_frames=tuple(tuple(frame) for frame in self.frames),
            )
            sent = len(last.trailing_text_ids)
            params = self.params.clone()
            params.output_kind = RequestOutputKind.DELTA
            params.max_tokens = self.allowed() - self.sampled
            params.extra_args = last.to_extra_args()
            yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=prompt_ids), sampling_params=params)
            while last.text_open:
                await chunk_done.wait()
                chunk_done.clear()
                if self.ended:
                    return
                if text.error is not None:  # the text failed while the chunk ran: no chunk after it
                    raise text.error
                if self.allowed() <= self.sampled:
                    tokens = len(prompt_ids) + self.sampled - held_before
                    if not holds.hold(self, tokens):  # over the hold bounds: released at once
                        self.released = True
                        return
                    try:
                        while self.allowed() <= self.sampled:
                            if not await text.wait(holds.hold_s):
                                self.released = True
                                return
                    finally:
                        holds.release(self)
                added = self.trailing(sent)
                last = last.next_chunk(added, not text.complete, self.sampled)
                sent += len(added)
                params = params.clone()
                params.max_tokens = self.allowed() - self.sampled
                params.extra_args = last.to_extra_args()
                clock.sent()
                yield StreamingInput(prompt=TokensPrompt(prompt_token_ids=[self.last_token]), sampling_params=params)

        assembler = self.generator.assembler()
        outputs = self.generator.engine.generate(chunks(), _first_params(self.generator), key)
        async with (
            contextlib.aclosing(outputs),  # closed last: an engine request still running is aborted
            contextlib.aclosing(_deadlined(outputs, clock, holds.chunk_deadline_s)) as timed,
        ):
            async for output in timed:
                if output is None:  # a chunk not scheduled in time (no room in the engine): release, resubmit
                    self.released = True
                    break
                completion = output.outputs[0]
                made = assembler.feed(completion.token_ids, completion.logprobs)
                if completion.token_ids:
                    self.sampled += len(completion.token_ids)
                    self.last_token = completion.token_ids[-1]
                if made:
                    self._sent(made)
                    yield np.asarray(made, dtype=np.int64).reshape(-1, self.groups)
                if not self.ended and (assembler.ended or self.sampled >= self.budget):
                    self._end(assembler)
                if completion.finish_reason is not None and not output.finished:
                    chunk_done.set()
                    if not self.ended and self.allowed() <= self.sampled:
                        yield np.zeros((0, self.groups), dtype=np.int64)  # held for text: every frame is out
        if not self.ended and not self.released:  # the engine ended the request otherwise (an abort)
            self.ended = True
            self.report.end("failed", "the engine ended the request before the utterance did")
            raise TalkerFailure("the engine ended the request before the utterance did: see the server log")

    def _sent(self, made: list[list[int]]) -> None:
        chars = self.text.id_chars
        for frame in made:
            read = min(max(self.held_ids + len(self.frames), 0), len(chars))
            self.report.frame_chars.append(chars[read - 1] if read else 0)
            self.frames.append(frame)

    def _end(self, assembler: Any) -> None:
        self.ended = True
        text, report = self.text, self.report
        if assembler.failed:
            report.end("failed", "the engine could not go on with this utterance (see the server log)")
            raise TalkerFailure("the engine could not go on with this utterance: see the server log")
        if not assembler.ended:
            report.end("max_frames", f"the budget of {self.budget} frames ran out")
        elif text.complete and report.spoken_chars >= text.text_chars:
            report.end("complete")
        else:
            report.end("eos", "the talker ended before the text did")


async def stream_text(
    generator: Any,
    request: Any,
    pieces: AsyncIterable[str],
    request_id: str,
    text_timeout_s: float | None = None,
    report: StreamReport | None = None,
) -> AsyncIterator[np.ndarray]:
    """See ``AsyncCodecFrameGenerator.stream_text`` (``generator``; ``request``: a ``SpeechRequest``). As for any
    request, ``max_frames`` caps the utterance: text past it is not spoken (as the official ``max_new_tokens``),
    and ``report`` says so."""
    if request.text is not None:
        raise SpeechRequestError("stream_text takes its text from `pieces`: set the request's text to None")
    if request.non_streaming_mode:
        raise SpeechRequestError("text that arrives in pieces is spoken in the streamed-text layout only")
    report = report if report is not None else StreamReport()
    voice = await asyncio.to_thread(generator.voice_prompt, request)
    generator.prompts.check_voice_fields(request.speaker, request.instruct, voice)
    text = StreamedText(generator, request, voice, text_timeout_s)

    async def read_pieces() -> None:
        try:
            async for piece in pieces:
                if piece is FLUSH:
                    await text.flush()
                    continue
                await text.add(piece)
                report.text_chars = text.text_chars
            await text.finish()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the session's error: raised to the consumer through the engine
            text.fail(error)
        except BaseException as error:  # not the text's to swallow: the consumer learns of it, then it goes on
            text.fail(error)
            raise

    reader = asyncio.create_task(read_pieces())
    try:
        async with contextlib.aclosing(TextSession(generator, request, text, report, request_id).run()) as made:
            async for frames in made:
                yield frames
    except (GeneratorExit, asyncio.CancelledError):
        report.end("cancelled")
        raise
    except BaseException as error:
        report.end("failed", str(error) or type(error).__name__)
        raise
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


class ChunkClock:
    """When a text stream's last chunk after the first was sent, until its first output (:func:`_deadlined`)."""

    def __init__(self) -> None:
        self.sent_at: float | None = None
        self.changed = asyncio.Event()

    def sent(self) -> None:
        self.sent_at = time.monotonic()
        self.changed.set()


async def _deadlined(outputs: Any, clock: ChunkClock, deadline_s: float) -> AsyncIterator[Any]:
    """The engine's ``outputs``, until a chunk (``clock``) has had no output for ``deadline_s``: then the engine
    request is aborted and None yielded. The wait for an output is never cancelled otherwise (that would abort
    the request)."""
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(outputs))
            since = clock.sent_at
            if since is None:  # no chunk pending: until an output or a chunk sent
                waker = asyncio.ensure_future(clock.changed.wait())
                try:
                    await asyncio.wait({pending, waker}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waker.cancel()
                clock.changed.clear()
            else:
                await asyncio.wait({pending}, timeout=max(since + deadline_s - time.monotonic(), 0.0))
            if not pending.done():
                if since is not None and time.monotonic() >= since + deadline_s:
                    yield None
                    return
                continue
            try:
                output = pending.result()
            except StopAsyncIteration:
                return
            pending, clock.sent_at = None, None
            yield output
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # the engine request is aborted (AsyncLLM.generate's own cancellation path)
            await asyncio.gather(pending, return_exceptions=True)


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
