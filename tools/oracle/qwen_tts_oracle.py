"""Run the official qwen-tts speech tokenizer: the numerical oracle for our Code2Wav decoder and our encoder.

Runs in the oracle venv (``make setup-oracle`` -> ``.venv-oracle``: qwen-tts 0.1.1 with its pinned
transformers 4.57.3, which the main venv cannot import). It

1. builds the official ``Qwen3TTSTokenizerV2Decoder`` from a ``decoder_config`` JSON,
2. fills it with random, non-trivial weights (``random_decoder_state``, keyed by the official
   module's own tensor names) and loads them strictly,
3. writes a checkpoint directory in the released layout from the official objects
   (``speech_tokenizer/config.json`` from the official config class, ``model.safetensors`` from
   the official state dict under ``decoder.``),
4. decodes seeded random codes with the official ``forward`` (the full decode) for each requested
   length, and with the official ``chunked_decode``, and saves codes and audio to ``--results``.

    .venv-oracle/bin/python tools/oracle/qwen_tts_oracle.py --decoder-config geometry.json \
        --checkpoint-dir ckpt/ --results oracle.pt --frames 1 7 71 --chunked-frames 400

The official package is imported file by file (its ``__init__`` pulls librosa, gradio and the
25 Hz tokenizer, none of which the 12 Hz decoder needs); the two files used are unmodified.

``encode`` (the oracle for our speech tokenizer encoder, the reference codes of voice cloning):

    .venv-oracle/bin/python tools/oracle/qwen_tts_oracle.py encode --speech-tokenizer DIR \
        --inputs audio.npz --out codes.npz [--sample-rate 24000] [--threads 1]

loads ``DIR`` (a checkpoint's ``speech_tokenizer/``) with the official ``Qwen3TTSTokenizer.from_pretrained``,
as ``Qwen3TTSModel.from_pretrained`` does, checks that every tensor of ``DIR/model.safetensors`` is in the
official model bit for bit and nothing else is (a strict load), then encodes each float32 array of
``audio.npz`` alone, as ``Qwen3TTSModel.create_voice_clone_prompt`` encodes one reference audio:
``speech_tokenizer.encode([wav], sr=sr).audio_codes[0]``. ``codes.npz`` holds int64 ``[frames, 16]`` codes
under the same names. The wrapper module imports librosa and soundfile, which it only calls to read files or
resample; where they are not installed, the talker oracle's stubs stand in (arrays at the tokenizer's rate
never reach them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def import_official_tokenizer_12hz() -> types.ModuleType:
    """The official ``modeling_qwen3_tts_tokenizer_v2`` module, without running ``qwen_tts/__init__``."""
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("qwen_tts is not installed here; run this with .venv-oracle/bin/python (make setup-oracle)")
    directory = Path(next(iter(spec.submodule_search_locations))) / "core" / "tokenizer_12hz"
    package = types.ModuleType("qwen_tts_tokenizer_12hz")
    package.__path__ = [str(directory)]
    sys.modules[package.__name__] = package
    return importlib.import_module(f"{package.__name__}.modeling_qwen3_tts_tokenizer_v2")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["encode"]:
        return encode_main(argv[1:])
    return decode_main(argv[1:] if argv[:1] == ["decode"] else argv)


def encode_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="qwen_tts_oracle.py encode", description="Encode audio with the official tokenizer"
    )
    parser.add_argument("--speech-tokenizer", type=Path, required=True, help="a checkpoint's speech_tokenizer/ dir")
    parser.add_argument("--inputs", type=Path, required=True, help="npz of 1-D float32 arrays")
    parser.add_argument("--out", type=Path, required=True, help="npz of int64 [frames, 16] codes, same names")
    parser.add_argument("--sample-rate", type=int, default=24000, help="sample rate of the input arrays")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import numpy as np
    from qwen_tts_talker_oracle import install_stubs  # the same directory: the stubs of the talker oracle

    torch.set_num_threads(args.threads)
    stubs = install_stubs()
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    start = time.perf_counter()
    tokenizer = Qwen3TTSTokenizer.from_pretrained(str(args.speech_tokenizer))
    check_strict_load(tokenizer.model, args.speech_tokenizer / "model.safetensors")
    print(
        f"[oracle] loaded {args.speech_tokenizer} in {time.perf_counter() - start:.2f} s (stubs: {stubs})", flush=True
    )

    encoder_config = tokenizer.model.encoder.config
    codes: dict[str, np.ndarray] = {}
    with np.load(args.inputs) as inputs:
        for name in inputs.files:
            wav = inputs[name]
            start = time.perf_counter()
            encoded = tokenizer.encode([wav], sr=args.sample_rate)  # as create_voice_clone_prompt, one reference
            codes[name] = encoded.audio_codes[0].cpu().numpy().astype(np.int64)
            print(
                f"[oracle] encode {name}: {wav.size} samples -> {codes[name].shape} in "
                f"{time.perf_counter() - start:.3f} s (attention {encoder_config._attn_implementation})",
                flush=True,
            )
    np.savez(args.out, **codes)
    return 0


def check_strict_load(model: torch.nn.Module, weights: Path) -> None:
    """Fail unless ``model``'s state dict is exactly the tensors of ``weights`` (names, shapes, values)."""
    from safetensors.torch import load_file

    expected = load_file(str(weights))
    state = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    differing = sorted(
        n for n in set(expected) & set(state) if not torch.equal(expected[n], state[n].to(expected[n].dtype))
    )
    if missing or unexpected or differing:
        raise SystemExit(
            f"the official model did not load {weights} strictly: {len(missing)} file tensors not in the model "
            f"{missing[:5]}, {len(unexpected)} model tensors not in the file {unexpected[:5]}, {len(differing)} "
            f"differing {differing[:5]}"
        )


def decode_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoder-config", type=Path, required=True, help="JSON file holding a decoder_config")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, nargs="*", default=[])
    parser.add_argument("--chunked-frames", type=int, default=0, help="also run chunked_decode on this many frames")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO_ROOT))
    from vllm_omni.testing.random_weights import random_decoder_state  # torch-only helper

    official = import_official_tokenizer_12hz()
    config_module = sys.modules["qwen_tts_tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"]
    decoder_config = json.loads(args.decoder_config.read_text())
    full_config = config_module.Qwen3TTSTokenizerV2Config(decoder_config=decoder_config)
    full_config.decode_upsample_rate = full_config.encode_downsample_rate = int(
        torch.tensor(decoder_config["upsample_rates"] + decoder_config["upsampling_ratios"]).prod()
    )
    decoder = official.Qwen3TTSTokenizerV2Decoder._from_config(full_config.decoder_config).eval()

    shapes = {name: tuple(t.shape) for name, t in decoder.state_dict().items()}
    state = random_decoder_state(shapes, seed=args.seed, num_quantizers=decoder_config["num_quantizers"])
    decoder.load_state_dict(state, strict=True)

    from safetensors.torch import save_file

    tokenizer_dir = args.checkpoint_dir / "speech_tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {f"decoder.{n}": t.contiguous() for n, t in decoder.state_dict().items()},
        str(tokenizer_dir / "model.safetensors"),
    )
    (tokenizer_dir / "config.json").write_text(full_config.to_json_string())
    (args.checkpoint_dir / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "note": "random weights"}))

    generator = torch.Generator().manual_seed(args.seed + 100)
    q, size = decoder_config["num_quantizers"], decoder_config["codebook_size"]
    results: dict[str, object] = {"shapes": shapes, "attn_implementation": decoder.config._attn_implementation}
    with torch.inference_mode():
        for frames in args.frames:
            codes = torch.randint(0, size, (1, q, frames), generator=generator)
            start = time.perf_counter()
            audio = decoder(codes)
            print(f"[oracle] forward T={frames}: {time.perf_counter() - start:.2f} s", flush=True)
            results[f"forward/{frames}"] = (codes, audio)
        if args.chunked_frames:
            codes = torch.randint(0, size, (1, q, args.chunked_frames), generator=generator)
            start = time.perf_counter()
            audio = decoder.chunked_decode(codes)
            print(f"[oracle] chunked_decode T={args.chunked_frames}: {time.perf_counter() - start:.2f} s", flush=True)
            results["chunked"] = (codes, audio)
    torch.save(results, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
