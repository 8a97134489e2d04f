"""Clone a voice offline (a Base checkpoint): reference audio and its transcript in, codec frames out.

    .venv-vllm/bin/python examples/clone_voice.py --model BASE_CKPT --ref-audio me.wav \
        --ref-text "What I say in me.wav." --text "Hello there." --out frames.npy

The reference is encoded once (speaker embedding, and its codes for in-context cloning; --x-vector-only
uses the embedding alone) and can serve any number of texts. The frames decode on any device plan, as
any voice's (examples/decode_on_device.py after `python -m vllm_omni.edge codec-stream record`).
"""

import argparse

import numpy as np

from vllm_omni.entrypoints.generation.speech import CodecFrameGenerator, SpeechRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Base checkpoint: directory or hub id")
    parser.add_argument("--ref-audio", required=True, help="the voice to clone: WAV, FLAC, MP3 or OGG, up to 30 s")
    parser.add_argument("--ref-text", help="the transcript of --ref-audio (in-context cloning)")
    parser.add_argument("--x-vector-only", action="store_true", help="clone from the speaker embedding alone")
    parser.add_argument("--text", required=True, action="append", help="what to say (repeat for more utterances)")
    parser.add_argument("--language", default="Auto")
    parser.add_argument("--max-frames", type=int, default=250)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--out", required=True, help="where to save int64[T, 16] frames (.npy; one per text: _1, _2)")
    parser.add_argument("--kv-cache-bytes", type=int, default=256 << 20, help="vLLM's KV cache on this machine")
    args = parser.parse_args()

    generator = CodecFrameGenerator(
        args.model, dtype="float32", enforce_eager=True, max_model_len=2048, kv_cache_memory_bytes=args.kv_cache_bytes
    )
    voice = generator.voice_prompt(
        SpeechRequest(text=".", ref_audio=args.ref_audio, ref_text=args.ref_text, x_vector_only_mode=args.x_vector_only)
    )
    mode = "x-vector only" if voice.x_vector_only else f"in context, {len(voice.reference_codes)} reference frames"
    print(f"voice from {args.ref_audio}: {mode}")
    requests = [
        SpeechRequest(text=text, language=args.language, voice=voice, max_frames=args.max_frames,
                      greedy=args.greedy or None)
        for text in args.text
    ]  # fmt: skip
    for index, frames in enumerate(generator.generate(requests)):
        out = args.out if len(requests) == 1 else args.out.replace(".npy", f"_{index + 1}.npy")
        np.save(out, frames)
        print(f"{len(frames)} frames ({len(frames) / 12.5:.2f} s of speech) -> {out}")
    generator.shutdown()


if __name__ == "__main__":  # vLLM starts worker processes: keep the guard
    main()
