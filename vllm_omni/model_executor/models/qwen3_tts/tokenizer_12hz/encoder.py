"""The encoder of the Qwen3-TTS 12 Hz speech tokenizer: 24 kHz mono audio -> codec frames of 16 codebooks.

Voice cloning in context needs the reference audio as codec frames (the reference codes). The encoder is a
Mimi encoder plus Mimi's split residual quantizer, built here from transformers' own Mimi modules
(``transformers.models.mimi``) under the module paths of the official ``Qwen3TTSTokenizerV2Encoder`` (a
``MimiModel`` with its decoder half removed), so the released ``encoder.*`` tensors load strictly.

Pipeline (one clip of ``N`` samples, released sizes in brackets):
    float32[1, 1, N] -> SEANet ``encoder`` [1, 512, N/960] -> ``encoder_transformer`` (8 causal layers)
    -> ``downsample`` (stride 2) [1, 512, N/1920] -> ``quantizer``: semantic RVQ (codebook 0) and acoustic
    RVQ (codebooks 1..), each nearest-neighbour in a 256-wide projection -> codes [16, ceil(N/1920)]

Two behaviours follow the official implementation (qwen-tts 0.1.1, which pins transformers 4.57.3) rather
than transformers 5:

* attention is causal over the whole clip. Transformers 4.57's Mimi ignores ``sliding_window`` (it builds a
  plain causal mask), transformers 5 applies it; the window is widened to the longest clip accepted so the two
  agree. (Kyutai's Mimi uses the 250-position window: 10 s at 25 Hz, so the two differ on longer clips.)
* only the first ``encoder_valid_num_quantizers`` codebooks are computed (the official code computes all
  32 and drops the rest; residual quantization makes the first 16 the same either way).

Needs transformers (the serving venv has it); it is imported when an encoder is built.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from .encoder_layout import (
    check_encoder_config,
    encoder_frame_rate,
    encoder_samples_per_frame,
    encoder_transformer_samples_per_frame,
)
from .errors import EncoderConfigError, EncoderWeightsError, InvalidAudioError
from .files import CONFIG_FILE, SPEECH_TOKENIZER_DIR, WEIGHTS_FILE, find_speech_tokenizer_dir

logger = logging.getLogger(__name__)

ENCODER_PREFIX = "encoder."
# The attention kernel of the official run (transformers 4.57 picks SDPA by default); eager gives the same
# codes on the test checkpoints, SDPA is faster.
ATTENTION = "sdpa"


def _import_mimi() -> Any:
    try:
        from transformers import MimiConfig
        from transformers.models.mimi import modeling_mimi
    except ImportError as exc:
        raise ImportError(
            "the speech tokenizer's encoder is built from transformers' Mimi modules: install transformers "
            "(it comes with the serving venv, `make setup-vllm`)"
        ) from exc
    return MimiConfig, modeling_mimi


def mimi_config(encoder_config: Mapping[str, Any]) -> Any:
    """A ``transformers.MimiConfig`` from a checkpoint's ``encoder_config``, set up to run as the official encoder.

    ``sliding_window`` becomes ``max_position_embeddings`` (see the module docstring): every clip
    :meth:`SpeechTokenizerEncoder.encode` accepts then attends causally over its whole length.
    """
    check_encoder_config(encoder_config)
    mimi_config_class, _ = _import_mimi()
    values = {k: v for k, v in encoder_config.items() if k not in ("model_type", "_frame_rate", "frame_rate")}
    values["frame_rate"] = encoder_frame_rate(encoder_config)
    try:
        config = mimi_config_class(**values)
    except (TypeError, ValueError) as exc:  # transformers' strict config validation raises both
        raise EncoderConfigError(f"encoder_config does not make a MimiConfig: {exc}") from exc
    config.sliding_window = config.max_position_embeddings
    config._attn_implementation = ATTENTION
    return config


class SpeechTokenizerEncoder(nn.Module):
    """Mimi encoder + split RVQ: mono 24 kHz float32 samples -> int64 codes ``[frames, num_quantizers]``.

    Submodules (checkpoint names less ``encoder.``): ``encoder`` (``MimiEncoder``), ``encoder_transformer``
    (``MimiTransformerModel``), ``downsample`` (``MimiConv1d``, stride 2, replicate padding) and ``quantizer``
    (``MimiSplitResidualVectorQuantizer``), exactly the official module tree.

    Attributes:
        sample_rate: input samples per second (24000 released).
        samples_per_frame: input samples per codec frame (1920 released: 12.5 frames per second).
        num_quantizers: codebooks per frame returned (``encoder_valid_num_quantizers``, 16 released).
        max_samples: the longest clip accepted, ``max_position_embeddings`` transformer positions (320 s released).
    """

    def __init__(self, encoder_config: Mapping[str, Any], num_quantizers: int = 16):
        super().__init__()
        config = mimi_config(encoder_config)
        _, mimi = _import_mimi()
        if not config.num_semantic_quantizers < num_quantizers <= config.num_quantizers:
            raise EncoderConfigError(
                f"encoder_valid_num_quantizers must be in {config.num_semantic_quantizers + 1}.."
                f"{config.num_quantizers} (the encoder's quantizers), found {num_quantizers}"
            )
        self.config = config
        self.encoder = mimi.MimiEncoder(config)
        self.encoder_transformer = mimi.MimiTransformerModel(config)
        self.downsample = None
        if config.frame_rate != config.encodec_frame_rate:  # as MimiModel.__init__
            self.downsample = mimi.MimiConv1d(
                config,
                config.hidden_size,
                config.hidden_size,
                kernel_size=2 * int(config.encodec_frame_rate / config.frame_rate),
                stride=2,
                bias=False,
                pad_mode="replicate",
                layer_idx=len(self.encoder._mimiconv1d_layer_names),
            )
        self.quantizer = mimi.MimiSplitResidualVectorQuantizer(config)
        self.sample_rate = int(config.sampling_rate)
        self.samples_per_frame = encoder_samples_per_frame(encoder_config)
        self.num_quantizers = num_quantizers
        self.max_samples = config.max_position_embeddings * encoder_transformer_samples_per_frame(encoder_config)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        """``float32[B, 1, N]`` audio -> ``int64[B, num_quantizers, ceil(N / samples_per_frame)]`` codes.

        Unchecked: :meth:`encode` validates. Clips of a batch must be equally long (the official encoder
        ignores padding masks, so padding would change the last frame).
        """
        embeddings = self.encoder(input_values)
        hidden = self.encoder_transformer(embeddings.transpose(1, 2), use_cache=False, return_dict=False)[0]
        embeddings = hidden.transpose(1, 2)
        if self.downsample is not None:
            embeddings = self.downsample(embeddings)
        codes = self.quantizer.encode(embeddings, self.num_quantizers)  # [K, B, T]
        return codes.transpose(0, 1)

    def check_samples(self, samples: object) -> np.ndarray:
        """Return ``samples`` if it is a non-empty, finite float32 mono array no longer than ``max_samples``."""
        if not isinstance(samples, np.ndarray):
            raise InvalidAudioError(f"audio must be a numpy array of float32 samples, found {type(samples).__name__}")
        if samples.dtype != np.float32:
            raise InvalidAudioError(
                f"audio must be float32 samples in [-1, 1] at {self.sample_rate} Hz, found dtype {samples.dtype}; "
                "convert it (integer PCM: divide by the full scale) before encoding"
            )
        if samples.ndim != 1:
            raise InvalidAudioError(
                f"audio must be one mono channel, shape [samples], found shape {list(samples.shape)}; "
                "mix the channels down first"
            )
        if samples.size == 0:
            raise InvalidAudioError("audio is empty: at least one sample is needed to make a frame")
        if samples.size > self.max_samples:
            raise InvalidAudioError(
                f"audio is {samples.size / self.sample_rate:.1f} s long; the encoder takes at most "
                f"{self.max_samples / self.sample_rate:.1f} s ({self.max_samples} samples at {self.sample_rate} Hz)"
            )
        if not np.isfinite(samples).all():
            bad = int(np.size(samples) - np.isfinite(samples).sum())
            raise InvalidAudioError(f"audio holds {bad} NaN or infinite samples; every sample must be finite")
        return samples

    @torch.inference_mode()
    def encode(self, samples: np.ndarray) -> np.ndarray:
        """Mono float32 samples at :attr:`sample_rate` -> ``int64[ceil(len / samples_per_frame), num_quantizers]``.

        The codes the official ``Qwen3TTSTokenizer.encode`` gives for the same array (its reference codes for
        in-context cloning). Raises :class:`InvalidAudioError` for input outside the contract.
        """
        samples = self.check_samples(samples)
        parameter = next(self.parameters())
        input_values = torch.from_numpy(np.ascontiguousarray(samples)).to(parameter.device, parameter.dtype)
        codes = self(input_values[None, None])[0]
        frames = math.ceil(samples.size / self.samples_per_frame)  # the official trim; a no-op for causal convs
        return codes[:, :frames].transpose(0, 1).to(torch.int64).cpu().numpy()

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> set[str]:
        """Load encoder-relative tensors strictly (every name, every shape); return the names loaded."""
        expected = {name: tuple(t.shape) for name, t in self.state_dict().items()}
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected))
        wrong = sorted(n for n in set(expected) & set(tensors) if tuple(tensors[n].shape) != expected[n])
        if missing or unexpected or wrong:
            parts = [
                f"{what} {len(names)}: {names[:4]}{' ...' if len(names) > 4 else ''}"
                for what, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
                if names
            ]
            raise EncoderWeightsError(
                f"the checkpoint's encoder.* tensors do not fit the encoder of its encoder_config "
                f"({'; '.join(parts)}). Expected the released Qwen3-TTS-12Hz speech tokenizer layout."
            )
        self.load_state_dict({name: t.to(torch.float32) for name, t in tensors.items()}, strict=True)
        self._forget_codebook_caches()
        return set(tensors)

    def _forget_codebook_caches(self) -> None:
        """Drop each Mimi codebook's cached ``embed_sum / cluster_usage``, computed at its first use, so it is
        computed again from the tensors now loaded and on the device now used."""
        for module in self.modules():
            if hasattr(module, "_embed"):
                module._embed = None

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .half(): the cached codebooks must follow
        result = super()._apply(fn, recurse)
        self._forget_codebook_caches()
        return result


def resolve_speech_tokenizer_dir(model: str | os.PathLike[str]) -> Path:
    """``model`` itself or its ``speech_tokenizer/`` folder, whichever holds ``config.json`` + ``model.safetensors``."""
    path = Path(model).expanduser()
    found = find_speech_tokenizer_dir(path)
    if found is not None:
        return found
    raise EncoderConfigError(
        f"no speech tokenizer at {path}: expected {CONFIG_FILE} and {WEIGHTS_FILE} in it or in its "
        f"{SPEECH_TOKENIZER_DIR}/ folder (the layout of a released Qwen3-TTS-12Hz checkpoint)"
    )


def _check_against_tokenizer(config: Qwen3TTSTokenizerV2Config, encoder_config: Mapping[str, Any]) -> None:
    """The encoder's rates and codes must be those the rest of the speech tokenizer (and the talker) expects."""
    decoder = config.decoder_config
    checks = (
        (
            encoder_samples_per_frame(encoder_config) == config.encode_downsample_rate,
            f"the encoder makes a frame every {encoder_samples_per_frame(encoder_config)} samples but "
            f"encode_downsample_rate is {config.encode_downsample_rate}",
        ),
        (
            encoder_config.get("sampling_rate", 24000) == config.input_sample_rate,
            f"encoder_config.sampling_rate {encoder_config.get('sampling_rate', 24000)} differs from "
            f"input_sample_rate {config.input_sample_rate}",
        ),
        (
            config.encoder_valid_num_quantizers == decoder.num_quantizers,
            f"encoder_valid_num_quantizers ({config.encoder_valid_num_quantizers}) differs from the decoder's "
            f"num_quantizers ({decoder.num_quantizers}): the codes would not decode",
        ),
        (
            encoder_config.get("codebook_size", 2048) == decoder.codebook_size,
            f"encoder_config.codebook_size ({encoder_config.get('codebook_size', 2048)}) differs from the decoder's "
            f"({decoder.codebook_size}): the codes would not decode",
        ),
    )
    for ok, what in checks:
        if not ok:
            raise EncoderConfigError(f"speech tokenizer config: {what}. Fix the checkpoint's config.json.")


def load_speech_tokenizer_encoder(
    model: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> SpeechTokenizerEncoder:
    """The speech tokenizer's encoder of ``model`` (a checkpoint dir or its ``speech_tokenizer/`` dir), in eval mode.

    Geometry from ``config.json`` (``encoder_config``, ``encoder_valid_num_quantizers``); weights are the
    ``encoder.*`` tensors of ``model.safetensors``, loaded strictly (``decoder.*`` is left alone). float32.
    """
    from safetensors import SafetensorError, safe_open

    directory = resolve_speech_tokenizer_dir(model)
    config = Qwen3TTSTokenizerV2Config.from_json_file(directory / CONFIG_FILE)
    if not config.encoder_config:
        raise EncoderConfigError(
            f"{directory / CONFIG_FILE} has no encoder_config: this speech tokenizer cannot encode"
        )
    check_encoder_config(config.encoder_config)
    _check_against_tokenizer(config, config.encoder_config)
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(directory / WEIGHTS_FILE, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                if name.startswith(ENCODER_PREFIX):
                    tensors[name[len(ENCODER_PREFIX) :]] = handle.get_tensor(name)
    except (SafetensorError, OSError) as exc:
        raise EncoderWeightsError(
            f"cannot read {directory / WEIGHTS_FILE}: {exc}. The file is corrupt or not safetensors; re-download it."
        ) from exc
    encoder = SpeechTokenizerEncoder(config.encoder_config, config.encoder_valid_num_quantizers)
    loaded = encoder.load_weights(tensors)
    encoder = encoder.to(device).eval()
    encoder.requires_grad_(False)
    logger.info(
        "loaded the speech tokenizer encoder from %s: %d tensors, %.1f M parameters, %d samples/frame, %d codebooks",
        directory,
        len(loaded),
        sum(p.numel() for p in encoder.parameters()) / 1e6,
        encoder.samples_per_frame,
        encoder.num_quantizers,
    )
    return encoder
