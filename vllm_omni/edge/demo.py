"""The main job on an embedded default: decode a few seconds of codec frames to a WAV file.

    python -m vllm_omni.edge.demo --out out/demo

No weights can be downloaded here, so by default the demo writes a checkpoint in the released
layout with RANDOM WEIGHTS at the released geometry (reused on the next run), decodes seeded
random codes with the in-tree Code2Wav decoder, and writes ``decoded.wav``. The audio is noise:
it shows the pipeline, not a voice. Pass ``--model`` to decode with a real checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import OUTPUT_SAMPLE_RATE

from .audio import write_wav
from .decoder_export import load_code2wav_decoder
from .testing.codes import random_codes
from .testing.make_checkpoint import ensure_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--model", help="checkpoint dir or hub id (default: a random-weight released-layout one)")
    parser.add_argument(
        "--geometry",
        choices=("released", "small"),
        default="released",
        help="geometry of the embedded random-weight checkpoint",
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")

    model = args.model
    if model is None:
        model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry, args.seed)
        print(f"[demo] using RANDOM WEIGHTS in the released layout at {model} (geometry: {args.geometry})")
    decoder = load_code2wav_decoder(model)
    config = decoder.config
    sample_rate = OUTPUT_SAMPLE_RATE
    frames = max(1, round(args.seconds * sample_rate / decoder.total_upsample))
    codes = random_codes(frames, config.num_quantizers, config.codebook_size, seed=args.seed)

    start = time.perf_counter()
    with torch.inference_mode():
        audio = decoder(codes)[0, 0].numpy()
    seconds = time.perf_counter() - start
    audio_seconds = audio.size / sample_rate
    wav = write_wav(args.out / "decoded.wav", audio, sample_rate)
    summary = {
        "model": str(model),
        "random_weights": args.model is None,
        "frames": frames,
        "samples": int(audio.size),
        "audio_seconds": audio_seconds,
        "decode_seconds": round(seconds, 3),
        "real_time_factor": round(seconds / audio_seconds, 3),
        "rms": float((audio**2).mean() ** 0.5),
        "wav": str(wav),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"[demo] decoded {frames} frames -> {audio_seconds:.2f} s of audio in {seconds:.2f} s "
        f"(real-time factor {summary['real_time_factor']}) -> {wav}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
