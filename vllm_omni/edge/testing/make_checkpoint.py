"""Write a random-weight checkpoint in the released Qwen3-TTS file layout.

    python -m vllm_omni.edge.testing.make_checkpoint --geometry released --seed 0 --out ckpt/

No weights can be downloaded here, so tests and demos decode with this. The layout is that of a
released ``Qwen/Qwen3-TTS-12Hz-*`` checkpoint::

    OUT/config.json                        a stub talker config, marked as random weights
    OUT/speech_tokenizer/config.json       Qwen3TTSTokenizerV2Config (decoder geometry under decoder_config)
    OUT/speech_tokenizer/model.safetensors decoder.* (random, non-trivial) + a few encoder.* tensors

The encoder tensors are placeholders: the decoder loader must ignore ``encoder.*``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)

from ..checkpoint import CONFIG_FILE, DECODER_PREFIX, SPEECH_TOKENIZER_DIR, WEIGHTS_FILE
from ..files import write_atomically
from .random_weights import random_decoder_state

logger = logging.getLogger(__name__)

GEOMETRIES = {
    "released": Qwen3TTSTokenizerV2DecoderConfig.released,
    "small": Qwen3TTSTokenizerV2DecoderConfig.small,
}
RANDOM_WEIGHTS_NOTE = "RANDOM WEIGHTS written by vllm_omni.edge.testing.make_checkpoint; not a trained model"


def decoder_shapes(config: Qwen3TTSTokenizerV2DecoderConfig) -> dict[str, tuple[int, ...]]:
    """``{decoder-relative name: shape}`` of every tensor a checkpoint of this geometry holds."""
    with torch.device("meta"):
        decoder = Qwen3TTSTokenizerV2Decoder(config)
    return {name: tuple(t.shape) for name, t in decoder.state_dict().items()}


def speech_tokenizer_config(decoder_config: Qwen3TTSTokenizerV2DecoderConfig) -> Qwen3TTSTokenizerV2Config:
    return Qwen3TTSTokenizerV2Config(
        decoder_config=decoder_config,
        encoder_config={"model_type": "mimi", "note": RANDOM_WEIGHTS_NOTE},
        decode_upsample_rate=decoder_config.total_upsample,
        encode_downsample_rate=decoder_config.total_upsample,
    )


def write_checkpoint(
    out: str | os.PathLike[str],
    geometry: str | Qwen3TTSTokenizerV2DecoderConfig = "small",
    seed: int = 0,
    decoder_state: dict[str, torch.Tensor] | None = None,
    talker: str | None = None,
    talker_type: str = "custom_voice",
) -> Path:
    """Write a checkpoint directory at ``out`` and return it.

    ``decoder_state`` (decoder-relative names) replaces the random weights, e.g. weights taken
    from another implementation. Files are written under temporary names and renamed, so an
    interrupted run never leaves a complete-looking checkpoint.
    """
    from safetensors.torch import save_file

    config = GEOMETRIES[geometry]() if isinstance(geometry, str) else geometry
    out = Path(out)
    tokenizer_dir = out / SPEECH_TOKENIZER_DIR
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    if decoder_state is None:
        decoder_state = random_decoder_state(decoder_shapes(config), seed=seed, num_quantizers=config.num_quantizers)
    generator = torch.Generator().manual_seed(seed + 1)
    tensors = {f"{DECODER_PREFIX}{name}": t.contiguous() for name, t in decoder_state.items()}
    # Placeholders for the encoder half, which the decoder loader must skip.
    tensors["encoder.quantizer.semantic_residual_vector_quantizer.input_proj.weight"] = torch.randn(
        8, 16, 1, generator=generator
    )
    tensors["encoder.encoder.layers.0.conv.weight"] = torch.randn(4, 1, 7, generator=generator)

    write_atomically(
        tokenizer_dir / WEIGHTS_FILE, lambda path: save_file(tensors, str(path), metadata={"note": RANDOM_WEIGHTS_NOTE})
    )
    tokenizer_config = speech_tokenizer_config(config).to_dict()
    tokenizer_config["note"] = RANDOM_WEIGHTS_NOTE
    tokenizer_config["random_weights"] = {"geometry": geometry if isinstance(geometry, str) else "custom", "seed": seed}
    write_atomically(tokenizer_dir / CONFIG_FILE, lambda path: path.write_text(json.dumps(tokenizer_config, indent=2)))
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
    """Like :func:`write_checkpoint`, but keep a complete checkpoint of the same geometry and seed."""
    out = Path(out)
    config_path = out / SPEECH_TOKENIZER_DIR / CONFIG_FILE
    if config_path.is_file() and (out / SPEECH_TOKENIZER_DIR / WEIGHTS_FILE).is_file():
        try:
            stamp = json.loads(config_path.read_text()).get("random_weights")
        except json.JSONDecodeError:
            stamp = None
        if stamp == {"geometry": geometry, "seed": seed}:
            logger.info("reusing the random-weight checkpoint at %s", out)
            return out
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
        choices=["custom_voice", "voice_design"],
        default="custom_voice",
        help="CustomVoice (preset speakers) or VoiceDesign (voice described by the instruction)",
    )
    args = parser.parse_args(argv)
    path = write_checkpoint(args.out, args.geometry, args.seed, talker=args.talker, talker_type=args.talker_type)
    talker = f" and a {args.talker} talker" if args.talker else ""
    print(f"wrote a {args.geometry}-geometry checkpoint{talker} with random weights (seed {args.seed}) to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
