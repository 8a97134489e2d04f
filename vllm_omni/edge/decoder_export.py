"""Load the Code2Wav decoder of a Qwen3-TTS checkpoint and export its windowed programs for devices.

Library use::

    from vllm_omni.edge.decoder_export import load_code2wav_decoder
    decoder = load_code2wav_decoder("/models/Qwen3-TTS-12Hz-1.7B-CustomVoice")
    audio = decoder(codes)   # int64[1, 16, T] -> float32[1, 1, T * 1920]

Command line (one fixed-shape program per window of the ramp, verified, plus ``manifest.json``)::

    python -m vllm_omni.edge.decoder_export --model DIR_OR_HUB_ID --ramp 2 4 8 16 25 --context 72 \
        --backend executorch --partitioner xnnpack --out-dir out/npu_phone
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import Qwen3TTSTokenizerV2Decoder

from .checkpoint import read_decoder_tensors, read_speech_tokenizer_config, resolve_speech_tokenizer
from .errors import CheckpointError, EdgeError

logger = logging.getLogger(__name__)


def load_decoder_weights(decoder: Qwen3TTSTokenizerV2Decoder, tensors: dict[str, torch.Tensor]) -> set[str]:
    """Copy ``tensors`` (decoder-relative names) into ``decoder``; return the names loaded.

    Every parameter must be present with its exact shape and no extra decoder tensor may exist:
    anything else means the checkpoint and the config disagree, and a partial load would decode noise.
    """
    expected = decoder.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshapen = sorted(
        f"{name}: expected {list(expected[name].shape)}, found {list(tensors[name].shape)}"
        for name in set(expected) & set(tensors)
        if tuple(expected[name].shape) != tuple(tensors[name].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): " + ", ".join(f"decoder.{n}" for n in missing[:20]))
    if unexpected:
        problems.append(
            f"unexpected {len(unexpected)} tensor(s): " + ", ".join(f"decoder.{n}" for n in unexpected[:20])
        )
    if misshapen:
        problems.append(
            f"{len(misshapen)} tensor(s) with the wrong shape: decoder." + "; decoder.".join(misshapen[:20])
        )
    if problems:
        raise CheckpointError(
            "the checkpoint's decoder weights do not match speech_tokenizer/config.json: "
            + " | ".join(problems)
            + ". Use the config.json that came with these weights."
        )
    for name, tensor in tensors.items():
        if not (tensor.dtype.is_floating_point and torch.isfinite(tensor).all()):
            kind = "non-finite values" if tensor.dtype.is_floating_point else f"dtype {tensor.dtype}"
            raise CheckpointError(f"decoder.{name} has {kind}; expected finite floating-point weights")
    decoder.load_state_dict(tensors, strict=True)
    return set(tensors)


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
    loaded = load_decoder_weights(decoder, tensors)
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


def build_parser() -> argparse.ArgumentParser:
    from .backends.executorch import PARTITIONERS
    from .backends.programs import PROGRAM_BACKENDS

    parser = argparse.ArgumentParser(
        prog="python -m vllm_omni.edge.decoder_export",
        description="Export, verify and describe the windowed Code2Wav programs of a Qwen3-TTS checkpoint.",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("QWEN3_TTS_MODEL"),
        help="checkpoint dir, its speech_tokenizer/ dir, or a hub id (default: $QWEN3_TTS_MODEL)",
    )
    parser.add_argument("--ramp", type=int, nargs="+", default=[2, 4, 8, 16, 25], help="chunk sizes in frames")
    parser.add_argument("--context", type=int, default=72, help="frames of decoded history in front of each chunk")
    parser.add_argument("--backend", default="executorch", help=f"one of {', '.join(PROGRAM_BACKENDS)}")
    parser.add_argument(
        "--partitioner", default=None, help=f"executorch delegate: {', '.join(PARTITIONERS)} (default xnnpack)"
    )
    parser.add_argument("--dtype", default="fp32", help="weights and activations (fp32)")
    parser.add_argument("--out-dir", required=True, type=Path, help="where the programs and manifest.json go")
    parser.add_argument("--no-check", action="store_true", help="skip running each program against eager")
    parser.add_argument("--tolerance", type=float, default=None, help="max abs difference allowed vs eager")
    return parser


def main(argv: list[str] | None = None) -> int:
    from .windowed_export import WindowedExportRequest, export_summary, export_windowed_programs

    args = build_parser().parse_args(argv)
    if not args.model:
        print("error: no model: pass --model DIR_OR_HUB_ID or set QWEN3_TTS_MODEL", file=sys.stderr)
        return 2
    request = WindowedExportRequest(
        model=args.model,
        out_dir=args.out_dir,
        ramp=tuple(args.ramp),
        context_frames=args.context,
        backend=args.backend,
        partitioner=args.partitioner,
        dtype=args.dtype,
        check=not args.no_check,
        tolerance=args.tolerance,
    )
    try:
        manifest = export_windowed_programs(request, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except EdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(export_summary(manifest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
