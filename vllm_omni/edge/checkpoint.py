"""Finding and reading a Qwen3-TTS checkpoint's speech tokenizer (``speech_tokenizer/``), and loading its decoder.

Layout of a released checkpoint (only the speech tokenizer part matters here)::

    MODEL/config.json                         the talker's config (not read)
    MODEL/speech_tokenizer/config.json        Qwen3TTSTokenizerV2Config, geometry under decoder_config
    MODEL/speech_tokenizer/model.safetensors  encoder.* and decoder.* tensors
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    DecoderWeightsError,
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2Decoder,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.files import (
    CONFIG_FILE,
    SPEECH_TOKENIZER_DIR,
    WEIGHTS_FILE,
    find_speech_tokenizer_dir,
)

from .errors import CheckpointError, CheckpointNotFoundError
from .files import file_sha256

logger = logging.getLogger(__name__)

DECODER_PREFIX = "decoder."


@dataclass(frozen=True)
class SpeechTokenizerFiles:
    """Where a speech tokenizer's files are, and what the user named to get there."""

    model_id: str
    directory: Path

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def weights_path(self) -> Path:
        return self.directory / WEIGHTS_FILE


def checkpoint_sha256(files: SpeechTokenizerFiles) -> str:
    """One digest over the speech tokenizer's config and weights: what makes two exports the same."""
    digest = hashlib.sha256()
    for path in (files.config_path, files.weights_path):
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def model_label(model: str | os.PathLike[str]) -> str:
    """How a plan names its model (``model.id``): a hub id as given; a local checkpoint by its directory's name
    only, so a plan served to clients does not carry the server's paths (a user name, a mount layout)."""
    text = str(model)
    if _looks_like_hub_id(text) and not os.path.exists(text):
        return text
    path = Path(text).expanduser()
    return path.resolve().name or path.name or text


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and not os.path.isabs(model)


def resolve_speech_tokenizer(model: str | os.PathLike[str]) -> SpeechTokenizerFiles:
    """Locate the speech tokenizer of ``model``: a checkpoint dir, its ``speech_tokenizer/`` dir, or a hub id.

    A hub id is fetched with ``huggingface_hub.snapshot_download`` restricted to the
    ``speech_tokenizer/`` files (the talker weights are not needed to decode).
    """
    model_id = os.fspath(model)
    path = Path(model_id).expanduser()
    if path.is_dir():
        found = find_speech_tokenizer_dir(path)
        if found is not None:
            return SpeechTokenizerFiles(model_id, found)
        raise CheckpointError(
            f"{path} is not a Qwen3-TTS checkpoint: expected {SPEECH_TOKENIZER_DIR}/{CONFIG_FILE} and "
            f"{SPEECH_TOKENIZER_DIR}/{WEIGHTS_FILE} inside it (found: {sorted(p.name for p in path.iterdir())[:10]}). "
            "Pass the checkpoint directory (the one holding speech_tokenizer/) or a hub id."
        )
    if not _looks_like_hub_id(model_id):
        raise CheckpointNotFoundError(
            f"no checkpoint directory at {model_id!r}; pass an existing local directory or a hub id like "
            "'Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice'"
        )
    return SpeechTokenizerFiles(model_id, _download_speech_tokenizer(model_id))


def _download_speech_tokenizer(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a base dependency
        raise CheckpointNotFoundError(
            f"cannot fetch {repo_id!r}: huggingface_hub is not installed (pip install huggingface_hub), "
            "or pass a local checkpoint directory"
        ) from exc
    logger.info("fetching %s/%s from the hub", repo_id, SPEECH_TOKENIZER_DIR)
    try:
        root = snapshot_download(repo_id, allow_patterns=[f"{SPEECH_TOKENIZER_DIR}/*"])
    except Exception as exc:  # the hub client raises many types (offline, 404, auth, timeouts)
        raise CheckpointNotFoundError(
            f"could not fetch the speech tokenizer of {repo_id!r} from the hub ({type(exc).__name__}: {exc}). "
            f"On an offline machine, download it elsewhere and pass the local directory instead: "
            f"--model /path/to/checkpoint (the directory that holds {SPEECH_TOKENIZER_DIR}/)"
        ) from exc
    directory = Path(root) / SPEECH_TOKENIZER_DIR
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise CheckpointError(
            f"hub repo {repo_id!r} has no {SPEECH_TOKENIZER_DIR}/{CONFIG_FILE} + {WEIGHTS_FILE}; "
            "is it a Qwen3-TTS 12 Hz checkpoint?"
        )
    return directory


def read_speech_tokenizer_config(files: SpeechTokenizerFiles) -> Qwen3TTSTokenizerV2Config:
    return Qwen3TTSTokenizerV2Config.from_json_file(files.config_path)


def read_decoder_tensors(files: SpeechTokenizerFiles) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Decoder tensors with the ``decoder.`` prefix stripped, and the names of the tensors ignored."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    try:
        with safe_open(files.weights_path, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                if name.startswith(DECODER_PREFIX):
                    tensors[name[len(DECODER_PREFIX) :]] = handle.get_tensor(name)
                else:
                    ignored.append(name)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(
            f"cannot read {files.weights_path}: {exc}. The file is corrupt or not safetensors; re-download it."
        ) from exc
    if not tensors:
        raise CheckpointError(
            f"{files.weights_path} holds no '{DECODER_PREFIX}*' tensors ({len(ignored)} other tensors); "
            "expected the speech tokenizer's decoder weights"
        )
    return tensors, ignored


def load_code2wav_decoder(
    model: str | os.PathLike[str], dtype: torch.dtype = torch.float32
) -> Qwen3TTSTokenizerV2Decoder:
    """The Code2Wav decoder of ``model`` (a checkpoint dir, its ``speech_tokenizer/`` dir, or a hub id).

    Geometry comes from ``speech_tokenizer/config.json``; weights are the ``decoder.*`` tensors of
    ``speech_tokenizer/model.safetensors`` (``encoder.*`` is ignored). Returns the decoder in eval
    mode, cast to ``dtype``, with SnakeBeta constants precomputed.
    """
    files = resolve_speech_tokenizer(model)
    config = read_speech_tokenizer_config(files)
    tensors, ignored = read_decoder_tensors(files)
    decoder = Qwen3TTSTokenizerV2Decoder(config.decoder_config)
    try:
        loaded = decoder.load_weights(tensors.items())
    except DecoderWeightsError as exc:
        raise CheckpointError(str(exc)) from exc
    decoder = decoder.to(dtype).eval()
    decoder.requires_grad_(False)
    decoder.precompute_snake_caches()
    logger.info(
        "loaded Code2Wav decoder from %s: %d tensors, %.1f M parameters, %d samples/frame (ignored %d non-decoder "
        "tensors)",
        files.directory,
        len(loaded),
        decoder.num_parameters() / 1e6,
        decoder.total_upsample,
        len(ignored),
    )
    return decoder
