"""The Base checkpoint's speaker encoder: log-mel features of 24 kHz audio -> one speaker embedding.

An ECAPA-TDNN (Desplanques et al., 2020) as the official ``qwen-tts`` 0.1.1 ``Qwen3TTSSpeakerEncoder``
computes it: a TDNN, SE-Res2Net blocks, multi-layer feature aggregation over the blocks' outputs,
attentive statistics pooling, and a 1x1 convolution to ``enc_dim`` (the talker's hidden size; the
embedding stands in the talker prompt where a CustomVoice speaker's codec embedding would).

Module and parameter names follow the released ``speaker_encoder.*`` tensors of
``model.safetensors``, so :func:`load_speaker_encoder` loads them with ``strict=True``. Every
convolution pads "same" by reflection, as the official module does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
from .reference_audio import SPEAKER_MEL, ReferenceAudioError, speaker_mel

WEIGHT_PREFIX = "speaker_encoder."


class SpeakerEncoderError(ValueError):
    """A checkpoint's speaker encoder cannot be built or loaded (config, tensor names or shapes)."""


def _conv(in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayLayer(nn.Module):
    """A dilated 1-D convolution over time, then ReLU: ``[B, C_in, T] -> [B, C_out, T]``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(in_channels, out_channels, kernel_size, dilation)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(features))


class Res2NetLayer(nn.Module):
    """Split the channels into ``scale`` groups; group i > 0 goes through its own TDNN after adding group
    i - 1's output (group 1 alone), group 0 passes unchanged: a hierarchy of receptive fields."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TimeDelayLayer(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(features, self.scale, dim=1)
        outputs = [groups[0]]
        previous: torch.Tensor | None = None
        for group, block in zip(groups[1:], self.blocks, strict=True):
            previous = block(group if previous is None else group + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Per-channel gates in (0, 1) from the time average: ``x * sigmoid(W2 relu(W1 mean_t(x)))``."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        gates = torch.sigmoid(self.conv2(torch.relu(self.conv1(features.mean(dim=2, keepdim=True)))))
        return features * gates


class SERes2NetBlock(nn.Module):
    """1x1 TDNN -> Res2Net -> 1x1 TDNN -> squeeze-excitation, plus the input (widths in = out)."""

    def __init__(self, channels: int, scale: int, se_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayLayer(channels, channels, 1, 1)
        self.res2net_block = Res2NetLayer(channels, scale, kernel_size, dilation)
        self.tdnn2 = TimeDelayLayer(channels, channels, 1, 1)
        self.se_block = SqueezeExcitation(channels, se_channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(features))))


def _weighted_mean_std(features: torch.Tensor, weights: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation over time of ``features [B, C, T]`` under ``weights`` summing to 1 over T."""
    mean = (weights * features).sum(dim=2)
    variance = (weights * (features - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, variance.clamp(min=eps).sqrt()


class AttentiveStatisticsPooling(nn.Module):
    """``[B, C, T] -> [B, 2C, 1]``: the mean and std over time under a per-channel softmax attention,
    whose input sees each frame beside the utterance's plain mean and std (global context)."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayLayer(3 * channels, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        frames = features.shape[2]
        uniform = torch.full_like(features[:, :1, :], 1.0 / frames)
        mean, std = _weighted_mean_std(features, uniform, self.eps)
        context = torch.cat([features, mean.unsqueeze(2).expand_as(features), std.unsqueeze(2).expand_as(features)], 1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_mean_std(features, attention, self.eps)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


def check_config(config: Qwen3TTSSpeakerEncoderConfig) -> None:
    """Raise :class:`SpeakerEncoderError` naming the field when ``config`` describes no buildable encoder."""
    channels, kernels, dilations = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
    problems = []
    if not len(channels) == len(kernels) == len(dilations) or len(channels) < 3:
        problems.append(
            f"enc_channels, enc_kernel_sizes and enc_dilations must have one entry per layer (at least 3), found "
            f"{len(channels)}, {len(kernels)} and {len(dilations)}"
        )
    else:
        blocks = channels[1:-1]
        if any(width != channels[0] for width in blocks):
            problems.append(f"enc_channels[:-1] must be equal (each SE-Res2Net block adds its input), found {channels}")
        if channels[-1] != sum(blocks):
            problems.append(
                f"enc_channels[-1] must be the sum of the SE-Res2Net blocks' widths ({sum(blocks)}: their outputs are "
                f"concatenated), found {channels[-1]}"
            )
        if channels[0] % config.enc_res2net_scale:
            problems.append(
                f"enc_channels must divide by enc_res2net_scale={config.enc_res2net_scale}, found {channels}"
            )
    if config.mel_dim != SPEAKER_MEL.n_mels:
        problems.append(
            f"mel_dim must be {SPEAKER_MEL.n_mels} (the official features are fixed), found {config.mel_dim}"
        )
    if config.sample_rate != SPEAKER_MEL.sample_rate:
        problems.append(f"sample_rate must be {SPEAKER_MEL.sample_rate}, found {config.sample_rate}")
    if problems:
        raise SpeakerEncoderError("speaker_encoder_config: " + "; ".join(problems))


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: log-mels ``[B, T, mel_dim]`` -> speaker embeddings ``[B, enc_dim]`` (see the module docstring)."""

    def __init__(self, config: Qwen3TTSSpeakerEncoderConfig) -> None:
        super().__init__()
        check_config(config)
        self.config = config
        channels, kernels, dilations = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        self.blocks = nn.ModuleList([TimeDelayLayer(config.mel_dim, channels[0], kernels[0], dilations[0])])
        for index in range(1, len(channels) - 1):
            self.blocks.append(
                SERes2NetBlock(
                    channels[index], config.enc_res2net_scale, config.enc_se_channels, kernels[index], dilations[index]
                )
            )
        self.mfa = TimeDelayLayer(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatisticsPooling(channels[-1], config.enc_attention_channels)
        self.fc = _conv(2 * channels[-1], config.enc_dim)

    @property
    def min_frames(self) -> int:
        """Fewest mel frames the encoder takes: reflection padding needs more frames than it pads."""
        layers = zip(self.config.enc_kernel_sizes, self.config.enc_dilations, strict=True)
        return 1 + max(d * (k - 1) - d * (k - 1) // 2 for k, d in layers)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        features = mels.transpose(1, 2)
        block_outputs = []
        for block in self.blocks:
            features = block(features)
            block_outputs.append(features)
        features = self.mfa(torch.cat(block_outputs[1:], dim=1))
        return self.fc(self.asp(features)).squeeze(2)

    @torch.inference_mode()
    def embed(self, samples_24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The speaker embedding ``[enc_dim]`` (float32, on CPU) of mono samples at 24 kHz (float32 in [-1, 1]).

        Raises :class:`ReferenceAudioError` when the audio is shorter than the encoder's receptive field needs.
        """
        mels = speaker_mel(samples_24k)
        if mels.shape[0] < self.min_frames:
            needed = SPEAKER_MEL.samples_for_frames(self.min_frames)
            raise ReferenceAudioError(
                f"reference audio too short: {mels.shape[0]} feature frames, the speaker encoder needs at least "
                f"{self.min_frames} ({needed} samples at {SPEAKER_MEL.sample_rate} Hz, "
                f"{needed / SPEAKER_MEL.sample_rate:.3f} s)"
            )
        parameter = next(self.parameters())
        embedding = self(mels.unsqueeze(0).to(device=parameter.device, dtype=parameter.dtype))[0]
        return embedding.float().cpu()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpeakerEncoderError(f"{path} is missing: expected a Qwen3-TTS checkpoint directory") from None
    except json.JSONDecodeError as error:
        raise SpeakerEncoderError(f"{path} is not valid JSON: {error}") from None


def speaker_encoder_config(model_dir: Path) -> Qwen3TTSSpeakerEncoderConfig:
    """The ``speaker_encoder_config`` of ``model_dir/config.json``, checked against the talker's hidden size."""
    root = _read_json(model_dir / "config.json")
    values = root.get("speaker_encoder_config")
    if not isinstance(values, dict) or root.get("tts_model_type") != "base":
        raise SpeakerEncoderError(
            f"{model_dir} is not a Base (voice-clone) checkpoint: tts_model_type={root.get('tts_model_type')!r}, "
            f"speaker_encoder_config {'present' if isinstance(values, dict) else 'absent'}; voice cloning needs a "
            "Qwen3-TTS-12Hz-*-Base checkpoint"
        )
    config = Qwen3TTSSpeakerEncoderConfig(**values)
    hidden = (root.get("talker_config") or {}).get("hidden_size")
    if hidden is not None and hidden != config.enc_dim:
        raise SpeakerEncoderError(
            f"speaker_encoder_config.enc_dim={config.enc_dim} differs from talker_config.hidden_size={hidden}: the "
            "embedding takes the place of a talker input vector"
        )
    return config


def _weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files that hold ``speaker_encoder.*``: model.safetensors, or the shards an index names."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map", {})
        return [model_dir / name for name in sorted({f for k, f in weight_map.items() if k.startswith(WEIGHT_PREFIX)})]
    raise SpeakerEncoderError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")


def read_speaker_encoder_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """``speaker_encoder.*`` tensors of the checkpoint, prefix stripped; no other tensor is read."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if name.startswith(WEIGHT_PREFIX):
                    state[name.removeprefix(WEIGHT_PREFIX)] = handle.get_tensor(name)
    return state


def load_state_strictly(encoder: SpeakerEncoder, state: dict[str, torch.Tensor], source: str) -> None:
    """``load_state_dict(strict=True)``, after a check whose error lists every missing, unexpected and
    mis-shaped tensor (``source`` names where they came from)."""
    expected = encoder.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{name}: found {tuple(state[name].shape)}, expected {tuple(expected[name].shape)}"
        for name in sorted(set(state) & set(expected))
        if state[name].shape != expected[name].shape
    ]
    if missing or unexpected or mismatched:
        lines = [f"{source}: the {WEIGHT_PREFIX}* tensors do not match the config's speaker encoder"]
        for title, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
            if names:
                shown = ", ".join(WEIGHT_PREFIX + name for name in names[:8])
                lines.append(f"{title} ({len(names)}): {shown}{' ...' if len(names) > 8 else ''}")
        raise SpeakerEncoderError("; ".join(lines))
    dtype = next(encoder.parameters()).dtype
    encoder.load_state_dict({name: tensor.to(dtype) for name, tensor in state.items()}, strict=True)


def load_speaker_encoder(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> SpeakerEncoder:
    """The speaker encoder of a Base checkpoint directory, in eval mode on CPU.

    Reads ``config.json`` and only the ``speaker_encoder.*`` tensors of ``model.safetensors`` (or its
    shards). float32 by default whatever the file's dtype: the encoder is small (about 12 M parameters
    at 1.7B) and the embedding then equals the official float32 one.
    """
    model_dir = Path(model_dir)
    encoder = SpeakerEncoder(speaker_encoder_config(model_dir)).to(dtype)
    load_state_strictly(encoder, read_speaker_encoder_state(model_dir), str(model_dir))
    return encoder.eval()
