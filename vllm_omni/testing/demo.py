"""The main job on an embedded default: build the execution plan of every hardware class, then decode with each.

    python -m vllm_omni.testing.demo --out out/demo

No weights can be downloaded here, so by default the demo writes a checkpoint in the released
layout with RANDOM WEIGHTS (small geometry unless ``--geometry released``; reused on the next
run). For each hardware class, and each graph kind it builds (``npu_phone``: the mission's windowed
programs and the exact stateful step), it runs the same build as ``python -m vllm_omni.edge build``
(artifacts verified in their runtime, plan validated), decodes a seeded stream through the plan's
decoder where this machine has the runtime (rockchip_npu reports its simulator check from the
build), writes a WAV per class and prints each plan's summary and a table against the full
decode. The audio is noise: it shows the pipeline, not a voice. ``--model`` uses a real checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vllm_omni.edge.audio import snr_db, write_wav
from vllm_omni.edge.builders.registry import build
from vllm_omni.edge.builders.request import BuildRequest
from vllm_omni.edge.checkpoint import load_code2wav_decoder
from vllm_omni.edge.errors import EdgeError
from vllm_omni.edge.hardware import UnknownHardwareClassError, get_hardware_class, hardware_classes
from vllm_omni.edge.runtime.open import open_decoder

from .codes import random_codes
from .make_checkpoint import ensure_checkpoint

# Sizes for the small geometry: every class builds in about a minute or two on 2 cores.
SMALL_SIZES = {"ramp": (2, 4), "context_frames": 4, "step_frames": 4, "first_step_frames": 2}


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_omni.testing.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    parser.add_argument("--model", help="checkpoint dir or hub id (default: a random-weight released-layout one)")
    parser.add_argument("--geometry", choices=("released", "small"), default="small", help="of the embedded checkpoint")
    parser.add_argument("--hardware", nargs="+", help="classes to build (default: every known class)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of the decoded stream")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")

    model = args.model
    if model is None:
        model = ensure_checkpoint(args.out / f"checkpoint-{args.geometry}", args.geometry, args.seed)
        _say(f"using RANDOM WEIGHTS in the released layout at {model} (geometry: {args.geometry})")
    sizes = SMALL_SIZES if args.geometry == "small" and args.model is None else {}
    decoder = load_code2wav_decoder(model)
    config = decoder.config
    frames = max(1, round(args.seconds * 24000 / decoder.total_upsample))
    codes = random_codes(frames, config.num_quantizers, config.codebook_size, seed=args.seed)
    with torch.inference_mode():
        reference = decoder(codes)[0, 0].numpy()
    stream = codes[0].T.numpy().copy()

    try:  # every name first: a typo must not surface after minutes of building the others
        records = [get_hardware_class(name) for name in args.hardware or hardware_classes()]
    except UnknownHardwareClassError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows, failed = [], []
    for record, graph in [(each, graph) for each in records for graph in each.graph_kinds]:
        name = record.name if graph == record.graph_kind else f"{record.name} --graph {graph}"
        _say(f"building {name}: {record.description}")
        started = time.perf_counter()
        out_dir = args.out / "plans" / (record.name if graph == record.graph_kind else f"{record.name}-{graph}")
        try:
            plan = build(record, BuildRequest(model=str(model), out_dir=out_dir, graph=graph, progress=_say, **sizes))
        except EdgeError as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            failed.append(name)
            continue
        row = {"class": name, "build_seconds": round(time.perf_counter() - started, 1), "plan": plan.plan_id[:12]}
        row["what_it_is"] = _what_it_is(plan)
        print(plan.summary())
        if plan.backend == "rknn":  # the simulator lives in the converter venv; the build already ran it
            row["decoded_with"] = "rknn-toolkit2 simulator (build check)"
            row["snr_db"] = plan.artifacts["main"].verification["snr_db"]
        else:
            stream_decoder = open_decoder(plan)
            started = time.perf_counter()
            audio = np.concatenate([stream_decoder.feed(stream), stream_decoder.flush()])
            seconds = time.perf_counter() - started
            wav = write_wav(out_dir.with_suffix(".wav"), audio, plan.codec.sample_rate)
            exact = _exact_start_frames(plan) * plan.codec.samples_per_frame
            row |= {
                "decoded_with": plan.backend,
                "snr_db": round(snr_db(reference, audio), 1),
                "exact_start_snr_db": round(snr_db(reference[:exact], audio[:exact]), 1) if exact else None,
                "real_time_factor": round(seconds / (audio.size / plan.codec.sample_rate), 3),
                "wav": str(wav),
            }
        rows.append(row)

    (args.out / "summary.json").write_text(json.dumps({"model": str(model), "random_weights": args.model is None,
                                                       "frames": frames, "classes": rows}, indent=2))  # fmt: skip
    print(f"\n{frames} frames ({frames * decoder.total_upsample / 24000:.2f} s), SNR against the full decode:")
    print("| class | what it is | plan | build s | decoded with | SNR dB | exact-start SNR dB | RTF |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |")
    for row in rows:
        start = row.get("exact_start_snr_db")
        print(
            f"| {row['class']} | {row['what_it_is']} | {row['plan']} | {row['build_seconds']} | {row['decoded_with']} "
            f"| {row['snr_db']:.1f} | {'' if start is None else start} | {row.get('real_time_factor', '')} |"
        )
    return 1 if failed else 0


def _what_it_is(plan) -> str:
    """One line a newcomer reads a row's SNR by."""
    if plan.graph_kind == "windowed":
        frames = _exact_start_frames(plan)
        return (
            f"windowed programs (the mission's phone plan): exact for the first {frames} frames, while the window "
            "holds the whole stream; an approximation after it, by design (docs/windowed_programs.md)"
        )
    if plan.backend == "rknn":
        return "stateful step, fp16 on the NPU: the simulator's check at build time (fp16 bar 40 dB)"
    return f"stateful step on {plan.backend}: exact at any length"


def _exact_start_frames(plan) -> int:
    """Frames a windowed plan decodes while its window still holds the whole stream (0 for stateful plans)."""
    if plan.graph_kind != "windowed":
        return 0
    decoded = 0
    for window in plan.schedule:
        if window.context_frames != decoded:
            break
        decoded += window.chunk_frames
    return decoded


if __name__ == "__main__":
    raise SystemExit(main())
