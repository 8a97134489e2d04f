"""Decode a codec stream on the device with an execution plan: the loop a phone, a board or a CPU runs.

    python examples/decode_on_device.py --plan PLAN_DIR --stream speech.qcs --out speech.wav [--rknn-runtime board]

Only numpy and the plan's runtime are needed (onnxruntime for CPU plans, rknn-toolkit-lite2 on a
Rockchip board: `--rknn-runtime board`), no torch. Frames are fed as the messages arrive; a segment end
or the end of the stream flushes the decoder, a reset drops its state.
"""

import argparse
from pathlib import Path

import numpy as np

from vllm_omni.edge.audio import write_wav
from vllm_omni.edge.runtime import open_decoder
from vllm_omni.edge.stream import FrameBatch, iter_events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--stream", required=True, type=Path, help="a recorded codec stream (.qcs)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rknn-runtime", default="auto", choices=("auto", "board", "simulator"))
    args = parser.parse_args()

    decoder = open_decoder(args.plan, rknn_runtime=args.rknn_runtime)
    audio, frames = [], 0
    with open(args.stream, "rb") as stream:
        for event in iter_events(stream):
            if not isinstance(event, FrameBatch):
                continue
            if event.reset:
                decoder.reset()
            if len(event.frames):
                audio.append(decoder.feed(event.frames))
                frames += len(event.frames)
            if event.segment_end or event.end_of_stream:
                audio.append(decoder.flush())
    samples = np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)
    write_wav(args.out, samples, decoder.codec.sample_rate)
    print(f"{frames} frames -> {len(samples) / decoder.codec.sample_rate:.2f} s of audio in {args.out}")


if __name__ == "__main__":
    main()
