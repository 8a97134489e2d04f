"""Write a random-weight checkpoint in the released Qwen3-TTS file layout.

    python -m vllm_omni.testing.make_checkpoint --geometry released --seed 0 --out ckpt/

No weights can be downloaded here, so tests and demos decode with this. The layout is that of a
released ``Qwen/Qwen3-TTS-12Hz-*`` checkpoint::

    OUT/config.json                        a stub talker config, marked as random weights
    OUT/speech_tokenizer/config.json       Qwen3TTSTokenizerV2Config (decoder_config + a Mimi encoder_config)
    OUT/speech_tokenizer/model.safetensors decoder.* and encoder.* (random, non-trivial)
    OUT/speech_tokenizer/preprocessor_config.json  the released feature extractor (official loaders need it)

The encoder half (audio -> reference codes for voice cloning) has the geometry that matches the decoder's
rate: the released Mimi encoder beside the released decoder (1920 samples per frame), a small one beside the
small decoder (48). The decoder tensors do not depend on the encoder's: they are the same bytes as before
the encoder was written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch

from vllm_omni.edge.checkpoint import CONFIG_FILE, DECODER_PREFIX, SPEECH_TOKENIZER_DIR, WEIGHTS_FILE
from vllm_omni.edge.files import write_atomically
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.encoder_layout import (
    RELEASED_ENCODER_CONFIG,
    SMALL_ENCODER_CONFIG,
    encoder_samples_per_frame,
    encoder_state_shapes,
)

from .random_encoder_weights import random_encoder_state
from .random_weights import random_decoder_state
from .stamps import STAMP_KEY, is_current, random_weights_stamp

logger = logging.getLogger(__name__)

GEOMETRIES = {
    "released": Qwen3TTSTokenizerV2DecoderConfig.released,
    "small": Qwen3TTSTokenizerV2DecoderConfig.small,
}
RANDOM_WEIGHTS_NOTE = "RANDOM WEIGHTS written by vllm_omni.testing.make_checkpoint; not a trained model"
ENCODER_PREFIX = "encoder."
# Encoder geometries by samples per frame, which the encoder and the decoder must share.
ENCODER_GEOMETRIES = {encoder_samples_per_frame(c): c for c in (RELEASED_ENCODER_CONFIG, SMALL_ENCODER_CONFIG)}
PREPROCESSOR_CONFIG_FILE = "preprocessor_config.json"
# The released speech tokenizer's preprocessor_config.json (transformers' EncodecFeatureExtractor).
PREPROCESSOR_CONFIG = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}
# The encoder's random weights draw from their own seed, so the decoder's stay what they were.
ENCODER_SEED_OFFSET = 2


def decoder_shapes(config: Qwen3TTSTokenizerV2DecoderConfig) -> dict[str, tuple[int, ...]]:
    """``{decoder-relative name: shape}`` of every tensor a checkpoint of this geometry holds."""
    with torch.device("meta"):
        decoder = Qwen3TTSTokenizerV2Decoder(config)
    return {name: tuple(t.shape) for name, t in decoder.state_dict().items()}


def encoder_config_for(decoder_config: Qwen3TTSTokenizerV2DecoderConfig) -> dict:
    """The Mimi ``encoder_config`` written beside a decoder: the one with the decoder's samples per frame."""
    encoder_config = ENCODER_GEOMETRIES.get(decoder_config.total_upsample)
    if encoder_config is None:
        raise ValueError(
            f"no random-weight encoder geometry makes {decoder_config.total_upsample} samples per frame "
            f"(known: {sorted(ENCODER_GEOMETRIES)}); use the released or small decoder geometry"
        )
    return dict(encoder_config)


def speech_tokenizer_config(decoder_config: Qwen3TTSTokenizerV2DecoderConfig) -> Qwen3TTSTokenizerV2Config:
    return Qwen3TTSTokenizerV2Config(
        decoder_config=decoder_config,
        encoder_config=encoder_config_for(decoder_config),
        encoder_valid_num_quantizers=decoder_config.num_quantizers,
        decode_upsample_rate=decoder_config.total_upsample,
        encode_downsample_rate=decoder_config.total_upsample,
    )


def save_reproducibly(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """``safetensors.torch.save_file``, the same bytes in every process for the same tensors and metadata.

    safetensors writes its ``__metadata__`` map in hash order, which changes from process to process, so a
    seed would give a different ``checkpoint_sha256`` (which plans are keyed by) half the time. The header is
    rewritten in place with that map's keys sorted: the same length, the data offsets untouched.
    """
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    with open(path, "r+b") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        canonical = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(canonical) > length:
            raise ValueError(f"the sorted safetensors header of {path} is {len(canonical)} bytes, over its {length}")
        handle.seek(8)
        handle.write(canonical.ljust(length, b" "))


def write_checkpoint(
    out: str | os.PathLike[str],
    geometry: str | Qwen3TTSTokenizerV2DecoderConfig = "small",
    seed: int = 0,
    decoder_state: dict[str, torch.Tensor] | None = None,
    talker: str | None = None,
    talker_type: str = "custom_voice",
    drive: str | None = None,
) -> Path:
    """Write a checkpoint directory at ``out`` and return it.

    ``decoder_state`` (decoder-relative names) replaces the random weights, e.g. weights taken
    from another implementation. Files are written under temporary names and renamed, so an
    interrupted run never leaves a complete-looking checkpoint.
    """
    config = GEOMETRIES[geometry]() if isinstance(geometry, str) else geometry
    out = Path(out)
    tokenizer_dir = out / SPEECH_TOKENIZER_DIR
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    if decoder_state is None:
        decoder_state = random_decoder_state(decoder_shapes(config), seed=seed, num_quantizers=config.num_quantizers)
    tokenizer_config = speech_tokenizer_config(config)
    encoder_state = random_encoder_state(
        encoder_state_shapes(tokenizer_config.encoder_config), seed=seed + ENCODER_SEED_OFFSET
    )
    tensors = {f"{DECODER_PREFIX}{name}": t.contiguous() for name, t in decoder_state.items()}
    tensors.update({f"{ENCODER_PREFIX}{name}": t.contiguous() for name, t in encoder_state.items()})

    write_atomically(
        tokenizer_dir / WEIGHTS_FILE,
        lambda path: save_reproducibly(tensors, path, metadata={"format": "pt", "note": RANDOM_WEIGHTS_NOTE}),
    )
    config_values = tokenizer_config.to_dict()
    config_values["note"] = RANDOM_WEIGHTS_NOTE
    config_values[STAMP_KEY] = random_weights_stamp(geometry if isinstance(geometry, str) else "custom", seed, drive)
    write_atomically(
        tokenizer_dir / PREPROCESSOR_CONFIG_FILE,
        lambda path: path.write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2)),
    )
    write_atomically(tokenizer_dir / CONFIG_FILE, lambda path: path.write_text(json.dumps(config_values, indent=2)))
    if talker is not None:
        from .talker_checkpoint import write_talker_files  # needs the `tokenizers` library

        write_talker_files(out, talker, seed, talker_type)
        return out
    talker_config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "note": RANDOM_WEIGHTS_NOTE + " (the talker is not included)",
    }
    write_atomically(out / CONFIG_FILE, lambda path: path.write_text(json.dumps(talker_config, indent=2)))
    return out


def ensure_checkpoint(out: str | os.PathLike[str], geometry: str = "small", seed: int = 0) -> Path:
    """Like :func:`write_checkpoint`, but keep a complete checkpoint of the same geometry and seed
    (:func:`.stamps.is_current`)."""
    if is_current(out, geometry, seed):
        logger.info("reusing the random-weight checkpoint at %s", out)
        return Path(out)
    return write_checkpoint(out, geometry, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="small")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.add_argument(
        "--talker",
        choices=["tiny", "0.6b"],
        default=None,
        help="also write a random-weight talker (config, weights, BPE tokenizer) of this geometry",
    )
    parser.add_argument(
        "--talker-type",
        choices=["custom_voice", "voice_design", "base"],
        default="custom_voice",
        help="CustomVoice (preset speakers), VoiceDesign (voice described by the instruction) or Base (voice cloning)",
    )
    args = parser.parse_args(argv)
    path = write_checkpoint(args.out, args.geometry, args.seed, talker=args.talker, talker_type=args.talker_type)
    talker = f" and a {args.talker} talker" if args.talker else ""
    print(f"wrote a {args.geometry}-geometry checkpoint{talker} with random weights (seed {args.seed}) to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
