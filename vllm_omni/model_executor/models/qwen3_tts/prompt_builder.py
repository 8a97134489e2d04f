"""Talker prompts as the official ``qwen-tts`` package builds them, encoded as engine prompt ids.

CustomVoice: ``[instruction] <|im_start|> assistant \\n``, then the codec prefix
(think/nothink, think_bos, [language], think_eos, [speaker], pad) over ``tts_pad``/``tts_bos``, then

* text given whole (``non_streaming_mode=True``): every text token plus ``codec_pad``, ``tts_eos``
  plus ``codec_pad``, ``tts_pad`` plus ``codec_bos``; generated steps add ``tts_pad``;
* text streamed (``False``): the first text token plus ``codec_bos``; generated step ``j`` adds
  text token ``j + 1``, then ``tts_eos``, then ``tts_pad``.

VoiceDesign is the same without a speaker, with the instruction describing the voice. Language
"auto" puts no language id (nothink); a Chinese dialect speaker with "chinese"/"auto" gets its
dialect's id. The 0.6B models ignore the instruction, as the official wrapper does.

Base (voice cloning, :class:`VoiceClonePrompt`) puts the speaker embedding where a speaker id goes
(a voice position, ``engine_contract``), and no instruction. x-vector only: then as CustomVoice. In
context: after the codec prefix, the reference text and the text to speak (then ``tts_eos``) beside
``codec_bos`` and the reference frames, as the official ``generate_icl_prompt``:

* text given whole: every text token plus ``codec_pad``, then ``codec_bos`` and each reference
  frame, each plus ``tts_pad``; generated steps add ``tts_pad``;
* text streamed: text token ``i`` plus codec position ``i`` (``codec_bos``, then the frames), the
  shorter side padded with ``tts_pad``; text tokens past the frames are the streamed text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.errors import RequestRefused

from .configuration_qwen3_tts import Qwen3TTSConfig
from .engine_contract import SPEAKER_SLOT, VOICE_SLOTS, encode_prompt_id, encode_voice_id

# The official text prompt: ROLE + text + END, tokenized whole; ids[:ROLE_TOKENS] are the role, ids[ROLE_TOKENS:-5]
# the text (-5: END's tokens).
ROLE = "<|im_start|>assistant\n"
END = "<|im_end|>\n<|im_start|>assistant\n"
ROLE_TOKENS = 3


class SpeechRequestError(RequestRefused, ValueError):
    """A speech request that cannot be served (a 400); the message says what is allowed."""


@dataclass(frozen=True)
class VoiceClonePrompt:
    """A voice to clone (Base checkpoints), as the official ``VoiceClonePromptItem``: the speaker embedding of
    the reference audio, and for in-context cloning its codes and transcript (``None``: x-vector only)."""

    speaker_embedding: tuple[float, ...]
    reference_codes: tuple[tuple[int, ...], ...] | None = None
    reference_text: str | None = None

    @property
    def x_vector_only(self) -> bool:
        return self.reference_codes is None


@dataclass(frozen=True)
class SpeechPrompt:
    """A request turned into engine inputs: prompt ids, the per-step streamed text ids, and the vectors of
    its voice positions (a cloned voice)."""

    prompt_ids: list[int]
    trailing_text_ids: list[int] = field(default_factory=list)
    speaker_embedding: tuple[float, ...] = ()
    reference_codes: tuple[tuple[int, ...], ...] = ()
    # Usage, as upstream vLLM-Omni counts it: tokens of the text and the instruction; reference frames in context.
    text_tokens: int = 0
    audio_tokens: int = 0


class PromptBuilder:
    """Builds :class:`SpeechPrompt` s for one checkpoint (its config and its text tokenizer)."""

    def __init__(self, config: Qwen3TTSConfig, tokenizer: Any, max_prompt_positions: int | None = None) -> None:
        self.config = config
        self.talker = config.talker_config
        self.tokenizer = tokenizer
        self.max_prompt_positions = max_prompt_positions
        # A fast tokenizer is one Rust object: calls from two threads at once can fail ("Already borrowed"); the
        # server tokenizes on its prompt pool and a text stream's tokenizer on the event loop, so both hold this.
        self.lock = threading.Lock()
        self.model_type = config.tts_model_type or "custom_voice"
        if self.model_type not in ("custom_voice", "voice_design", "base"):
            raise SpeechRequestError(
                f"this checkpoint is a {self.model_type!r} model; the talker serves 'custom_voice', "
                "'voice_design' and 'base' checkpoints"
            )

    def _ids(self, text: str) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _pair(self, text_id: int, codec_id: int | None) -> int:
        return encode_prompt_id(text_id, codec_id, self.talker.text_vocab_size, self.talker.vocab_size)

    def _voice(self, text_id: int, slot: int) -> int:
        return encode_voice_id(text_id, slot, self.talker.text_vocab_size, self.talker.vocab_size)

    def language_id(self, language: str | None, speaker: str | None) -> int | None:
        name = (language or "auto").lower()
        # A dialect is taken by name too (upstream vLLM-Omni does; the official package lists only the others).
        if name != "auto" and name not in self.talker.codec_language_id:
            dialects = sorted(set(self.talker.codec_language_id) - set(self.config.supported_languages))
            known = [*self.config.supported_languages, *dialects]
            raise SpeechRequestError(f"unknown language {language!r}; this checkpoint supports: {', '.join(known)}")
        language_id = None if name == "auto" else self.talker.codec_language_id[name]
        dialect = self.talker.spk_is_dialect.get(speaker.lower()) if speaker else False
        if name in ("chinese", "auto") and dialect:
            language_id = self.talker.codec_language_id[dialect]
        return language_id

    def speaker_id(self, speaker: str | None) -> int | None:
        if self.model_type == "base":
            if speaker:
                raise SpeechRequestError(
                    f"a Base checkpoint has no preset speakers (got {speaker!r}): clone a voice from reference "
                    "audio (ref_audio, ref_text), give its speaker_embedding, or name a voice uploaded to the server"
                )
            return None
        if self.model_type == "voice_design":
            if speaker:
                raise SpeechRequestError(
                    "a VoiceDesign checkpoint has no preset speakers: describe the voice in `instruct` and leave "
                    "`speaker` empty"
                )
            return None
        known = self.config.supported_speakers
        if not speaker or speaker.lower() not in self.talker.spk_id:
            raise SpeechRequestError(f"unknown speaker {speaker!r}; this checkpoint's speakers: {', '.join(known)}")
        return self.talker.spk_id[speaker.lower()]

    def split_text(self, text: str) -> tuple[list[int], list[int]]:
        """The role's and the text's token ids, as the official prompt tokenizes ``ROLE + text + END``."""
        ids = self._ids(f"{ROLE}{text}{END}")
        return ids[:ROLE_TOKENS], ids[ROLE_TOKENS:-5]

    def build(
        self,
        text: str,
        speaker: str | None = None,
        language: str | None = None,
        instruct: str | None = None,
        non_streaming_mode: bool | None = None,
        voice: VoiceClonePrompt | None = None,
    ) -> SpeechPrompt:
        """The prompt of one utterance. ``non_streaming_mode`` None: the official default of the model type
        (text given whole for CustomVoice/VoiceDesign, streamed for Base's ``generate_voice_clone``)."""
        if not isinstance(text, str) or not text.strip():
            raise SpeechRequestError("the text to speak is empty")
        prompt = self.assemble(*self.split_text(text), speaker, language, instruct, non_streaming_mode, voice)
        assert prompt is not None  # whole text: always complete
        return prompt

    def check_voice_fields(self, speaker: str | None, instruct: str | None, voice: VoiceClonePrompt | None) -> None:
        """Refuse a speaker, instruction or cloned voice this checkpoint cannot take (before any text is known)."""
        if self.model_type == "voice_design" and not instruct:
            raise SpeechRequestError("a VoiceDesign checkpoint needs `instruct`, the description of the voice")
        self.speaker_id(speaker)
        self._check_voice(voice, instruct)

    def assemble(
        self,
        role: list[int],
        text_ids: list[int],
        speaker: str | None = None,
        language: str | None = None,
        instruct: str | None = None,
        non_streaming_mode: bool | None = None,
        voice: VoiceClonePrompt | None = None,
        complete: bool = True,
    ) -> SpeechPrompt | None:
        """The prompt of tokenized text (:meth:`split_text`). ``complete`` False: ``text_ids`` is the start of a
        text still arriving (the streamed layout only); its ``trailing_text_ids`` are those known so far (no
        ``tts_eos`` yet), and None is returned while too little text is known for the prompt (the first text
        token; in context, enough to fill the reference frames' positions)."""
        if self.model_type == "voice_design" and not instruct:
            raise SpeechRequestError("a VoiceDesign checkpoint needs `instruct`, the description of the voice")
        speaker_id = self.speaker_id(speaker)
        self._check_voice(voice, instruct)
        if non_streaming_mode is None:
            non_streaming_mode = self.model_type != "base"
        if not complete and non_streaming_mode:
            raise SpeechRequestError("text that is still arriving is spoken in the streamed-text layout only")
        language_id = self.language_id(language, speaker)
        size = self.config.tts_model_size
        if size and size in "0b6":  # the official wrapper drops the instruction for 0.6B models
            instruct = None
        if complete and not text_ids:
            raise SpeechRequestError("the text to speak is empty after tokenization")
        if not text_ids:
            return None
        talker, cfg = self.talker, self.config
        prompt: list[int] = []
        if instruct:
            prompt += [self._pair(t, None) for t in self._ids(f"<|im_start|>user\n{instruct}<|im_end|>\n")]
        prompt += [self._pair(t, None) for t in role]
        if language_id is None:
            codec = [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
        else:
            codec = [talker.codec_think_id, talker.codec_think_bos_id, language_id, talker.codec_think_eos_id]
        if speaker_id is not None:
            codec.append(speaker_id)
        elif voice is not None:
            codec.append(None)  # the speaker embedding's voice position
        codec += [talker.codec_pad_id, talker.codec_bos_id]
        for index, codec_id in enumerate(codec[:-1]):
            text_id = cfg.tts_pad_token_id if index < len(codec) - 2 else cfg.tts_bos_token_id
            prompt.append(self._voice(text_id, SPEAKER_SLOT) if codec_id is None else self._pair(text_id, codec_id))
        end = [cfg.tts_eos_token_id] if complete else []
        if voice is not None and not voice.x_vector_only:
            reference = self._ids(f"<|im_start|>assistant\n{voice.reference_text}<|im_end|>\n")[3:-2]
            text = reference + text_ids + end
            if not complete and len(text) < len(voice.reference_codes or ()) + 1:
                return None  # the prompt pairs each reference frame with a text token: wait for them
            body, trailing = self._in_context(text, voice, non_streaming_mode)
            prompt += body
        elif non_streaming_mode:
            prompt += [self._pair(t, talker.codec_pad_id) for t in text_ids]
            prompt += [
                self._pair(cfg.tts_eos_token_id, talker.codec_pad_id),
                self._pair(cfg.tts_pad_token_id, talker.codec_bos_id),
            ]
            trailing = []
        else:
            prompt.append(self._pair(text_ids[0], talker.codec_bos_id))
            trailing = [*text_ids[1:], *end]
        if self.max_prompt_positions is not None and len(prompt) > self.max_prompt_positions:
            raise SpeechRequestError(
                f"the prompt takes {len(prompt)} positions, more than the {self.max_prompt_positions} this engine "
                "allows (max_model_len less room for frames): shorten the text, instruction or reference audio, "
                "or raise max_model_len"
            )
        text_tokens = len(text_ids) + (len(self._ids(instruct)) if instruct else 0)
        if voice is None:
            return SpeechPrompt(prompt, trailing, text_tokens=text_tokens)
        codes = voice.reference_codes or ()
        audio_tokens = 0 if voice.x_vector_only else len(codes)
        return SpeechPrompt(prompt, trailing, voice.speaker_embedding, codes, text_tokens, audio_tokens)

    def _check_voice(self, voice: VoiceClonePrompt | None, instruct: str | None) -> None:
        if self.model_type != "base":
            if voice is not None:
                raise SpeechRequestError(
                    f"voice cloning needs a Base checkpoint; this one is {self.model_type!r}: use its speakers "
                    "(CustomVoice) or describe the voice in `instruct` (VoiceDesign)"
                )
            return
        if voice is None:
            raise SpeechRequestError(
                "a Base checkpoint clones a voice: give ref_audio (with ref_text, or x_vector_only_mode), a "
                "speaker_embedding, or the name of an uploaded voice"
            )
        if instruct:
            raise SpeechRequestError("a Base checkpoint takes no `instruct`: the reference audio gives the voice")
        if not voice.x_vector_only and not (voice.reference_text or "").strip():
            raise SpeechRequestError(
                "in-context cloning needs ref_text, the transcript of the reference audio (or set x_vector_only_mode)"
            )

    def _in_context(
        self, text: list[int], voice: VoiceClonePrompt, non_streaming_mode: bool
    ) -> tuple[list[int], list[int]]:
        """The in-context positions (``generate_icl_prompt``) and the streamed text left for generated steps."""
        talker, cfg = self.talker, self.config
        frames = len(voice.reference_codes or ())
        if not frames:
            raise SpeechRequestError("in-context cloning needs reference audio codes: the reference audio is empty")
        if frames >= VOICE_SLOTS:
            raise SpeechRequestError(
                f"the reference audio is {frames} frames; a prompt holds at most {VOICE_SLOTS - 1}: use a shorter clip"
            )
        # codec position 0 is codec_bos, position i >= 1 reference frame i - 1 (voice slot i).
        codec = lambda i, text_id: (  # noqa: E731
            self._pair(text_id, talker.codec_bos_id) if i == 0 else self._voice(text_id, i)
        )
        if non_streaming_mode:
            body = [self._pair(t, talker.codec_pad_id) for t in text]
            body += [codec(i, cfg.tts_pad_token_id) for i in range(frames + 1)]
            return body, []
        positions = frames + 1
        padded = text[:positions] + [cfg.tts_pad_token_id] * max(0, positions - len(text))
        return [codec(i, t) for i, t in enumerate(padded)], text[positions:]
