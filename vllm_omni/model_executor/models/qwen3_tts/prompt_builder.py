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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .configuration_qwen3_tts import Qwen3TTSConfig
from .engine_ids import encode_prompt_id


class SpeechRequestError(ValueError):
    """A speech request that cannot be served; the message says what is allowed."""


@dataclass(frozen=True)
class SpeechPrompt:
    """A request turned into engine inputs: prompt ids and the per-step streamed text ids."""

    prompt_ids: list[int]
    trailing_text_ids: list[int] = field(default_factory=list)


class PromptBuilder:
    """Builds :class:`SpeechPrompt` s for one checkpoint (its config and its text tokenizer)."""

    def __init__(self, config: Qwen3TTSConfig, tokenizer: Any, max_prompt_positions: int | None = None) -> None:
        self.config = config
        self.talker = config.talker_config
        self.tokenizer = tokenizer
        self.max_prompt_positions = max_prompt_positions
        self.model_type = config.tts_model_type or "custom_voice"
        if self.model_type not in ("custom_voice", "voice_design"):
            raise SpeechRequestError(
                f"this checkpoint is a {self.model_type!r} model; the talker serves 'custom_voice' and "
                "'voice_design' checkpoints (voice cloning from reference audio is not supported)"
            )

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _pair(self, text_id: int, codec_id: int | None) -> int:
        return encode_prompt_id(text_id, codec_id, self.talker.text_vocab_size, self.talker.vocab_size)

    def language_id(self, language: str | None, speaker: str | None) -> int | None:
        name = (language or "auto").lower()
        if name not in self.config.supported_languages:
            raise SpeechRequestError(
                f"unknown language {language!r}; this checkpoint supports: {', '.join(self.config.supported_languages)}"
            )
        language_id = None if name == "auto" else self.talker.codec_language_id[name]
        dialect = self.talker.spk_is_dialect.get(speaker.lower()) if speaker else False
        if name in ("chinese", "auto") and dialect:
            language_id = self.talker.codec_language_id[dialect]
        return language_id

    def speaker_id(self, speaker: str | None) -> int | None:
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

    def build(
        self,
        text: str,
        speaker: str | None = None,
        language: str | None = None,
        instruct: str | None = None,
        non_streaming_mode: bool = True,
    ) -> SpeechPrompt:
        if not isinstance(text, str) or not text.strip():
            raise SpeechRequestError("the text to speak is empty")
        if self.model_type == "voice_design" and not instruct:
            raise SpeechRequestError("a VoiceDesign checkpoint needs `instruct`, the description of the voice")
        speaker_id = self.speaker_id(speaker)
        language_id = self.language_id(language, speaker)
        size = self.config.tts_model_size
        if size and size in "0b6":  # the official wrapper drops the instruction for 0.6B models
            instruct = None

        ids = self._ids(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        role, text_ids = ids[:3], ids[3:-5]
        if not text_ids:
            raise SpeechRequestError("the text to speak is empty after tokenization")
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
        codec += [talker.codec_pad_id, talker.codec_bos_id]
        for index, codec_id in enumerate(codec[:-1]):
            text_id = cfg.tts_pad_token_id if index < len(codec) - 2 else cfg.tts_bos_token_id
            prompt.append(self._pair(text_id, codec_id))
        if non_streaming_mode:
            prompt += [self._pair(t, talker.codec_pad_id) for t in text_ids]
            prompt += [
                self._pair(cfg.tts_eos_token_id, talker.codec_pad_id),
                self._pair(cfg.tts_pad_token_id, talker.codec_bos_id),
            ]
            trailing: list[int] = []
        else:
            prompt.append(self._pair(text_ids[0], talker.codec_bos_id))
            trailing = [*text_ids[1:], cfg.tts_eos_token_id]
        if self.max_prompt_positions is not None and len(prompt) > self.max_prompt_positions:
            raise SpeechRequestError(
                f"the prompt takes {len(prompt)} positions, more than the {self.max_prompt_positions} this engine "
                "allows (max_model_len less room for frames): shorten the text or instruction, or raise max_model_len"
            )
        return SpeechPrompt(prompt, trailing)
