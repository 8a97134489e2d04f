"""The talker's and the decoder's device-side parts on a GPU, in plain torch (no vLLM, no transformers).

    PYTHONPATH=. python tools/gpu_check.py --out out/gpu-check [--device cuda] [--geometry released|small]
    make gpu-check

A lent GPU machine has torch with CUDA but no vLLM and no registry, so this checks the parts of a GPU
server that are plain torch, with RANDOM WEIGHTS, at the released sizes (the code predictor of the 0.6B
and of the 1.7B talker, whose hidden 2048 adds the projection to the predictor's width):

* the fused code predictor (what the engine runs) with the residual sampler, on the device in fp32 and
  bf16 against the reference predictor on the CPU in fp32, at B = 1, 3, 16, 48: greedy rows must be equal
  in fp32; bf16 greedy codes must agree with fp32's in at least :data:`MIN_BF16_AGREEMENT` of codes (a
  flipped near-tie changes the frame's later codes too); sampled rows use counter-based uniforms, so they
  agree wherever the scores do (reported); neither torch's CPU nor its CUDA RNG may move;
* the buckets captured in CUDA graphs (``BucketedCodePredictor.capture_all``: every bucket, greedy and mixed,
  one memory pool) and replayed on the inputs they were captured with and on fresh ones, padded (3 -> 4,
  48 -> 64): equal to eager execution, code for code;
* speed: eager (reference and fused) against replayed milliseconds per step at B = 1 .. 64, back to back,
  as steps/s and frames/s; and the kernels one step launches (CUDA kernels from the profiler; on the CPU,
  ATen ops);
* the speech-tokenizer decoder's full decode and its stateful step decode (B = 16 after a first step of 2)
  on the device against the CPU full decode: SNR in dB and max-abs difference.

``--device cpu`` runs every check but the capture (the buckets run eagerly at their static shapes): the
CPU tests run it so (``tests/tools/test_gpu_check.py``). Writes ``gpu_check.json`` and prints tables;
exits 1 when a required check fails, 2 on bad arguments or a missing device. Under 5 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.graphs.stateful import Code2WavStep
from vllm_omni.edge.runtime.stateful_decoder import StatefulDecoder
from vllm_omni.model_executor.models.qwen3_tts.code_predictor import Qwen3TTSCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.code_predictor_graphs import BUCKETS, BucketedCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.fused_code_predictor import FusedCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.residual_sampler import ResidualSampling
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.testing.random_weights import random_decoder_state

BATCHES = (1, 3, 16, 48)  # 3 and 48 run in padded buckets (4, 64)
SPEED_BATCHES = BUCKETS  # 1 .. 64
MIN_DECODER_SNR_DB = 60.0  # fp32 on two devices: kernels differ in summation order, not in the result
# bf16 greedy codes equal to fp32's, over all the greedy rows of a geometry's batches (68 frames, 34 greedy): bf16's
# 8-bit mantissa flips picks whose top-2 gap is below about 1% of the logits' scale, and a flip changes the frame's
# later codes, so one frame alone says little (B = 1 measured 0.40 and 1.00). These random weights spread like a
# trained model's; the CPU measured 0.89 (0.6B) and 0.88 (1.7B) pooled.
MIN_BF16_AGREEMENT = 0.75
_RELEASED = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128}  # fmt: skip
# The code predictor of the released checkpoints (0.6B and 1.7B: Qwen3TTSCodePredictorConfig's defaults; the
# 1.7B talker is 2048 wide, so its predictor projects), and a small one with every structural feature (GQA, a
# projection from a wider talker) for the CPU tests.
PREDICTORS = {
    "0.6b": {"talker_hidden": 1024, **_RELEASED},
    "1.7b": {"talker_hidden": 2048, **_RELEASED},
    "small": {"talker_hidden": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
}  # fmt: skip
GEOMETRIES = {"released": ("0.6b", "1.7b"), "small": ("small",)}


def code_predictor(geometry: str, seed: int = 0) -> tuple[Qwen3TTSCodePredictor, int]:
    """A random-weight code predictor (fp32, CPU) and its talker width."""
    sizes = dict(PREDICTORS[geometry])
    talker_hidden = sizes.pop("talker_hidden")
    config = SimpleNamespace(
        **sizes, vocab_size=2048, num_code_groups=16, rms_norm_eps=1e-6, rope_theta=1_000_000.0, attention_bias=False
    )
    torch.manual_seed(seed)
    predictor = Qwen3TTSCodePredictor(config, talker_hidden).eval()
    with torch.no_grad():
        for parameter in predictor.parameters():  # a spread like a trained model's, so picks are not near ties
            parameter.normal_(0.0, 0.05 if parameter.dim() > 1 else 0.02)
    return predictor, talker_hidden


def sampling(rows: int, device: torch.device | str, seed: int = 0) -> ResidualSampling:
    """Every other row greedy; the sampled rows with a mix of top-k and top-p."""
    greedy = torch.arange(rows) % 2 == 0
    return ResidualSampling(
        all_greedy=False,
        greedy=greedy.to(device),
        temperature=torch.full((rows,), 0.9).to(device),
        top_k=torch.tensor([[0, 50, 10, 0][i % 4] for i in range(rows)]).to(device),
        top_p=torch.tensor([[1.0, 1.0, 0.8, 0.5][i % 4] for i in range(rows)]).to(device),
        seeds=(torch.arange(rows, dtype=torch.int64) * 7919 + seed).to(device),
        frames=torch.arange(rows, dtype=torch.int64).to(device),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, run, repeats: int) -> float:
    """Median seconds of ``run()`` over ``repeats`` (after one warm-up)."""
    run()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def _inputs(batch: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator)


def check_code_predictor(geometry: str, device: torch.device, repeats: int, batches=BATCHES) -> list[dict]:
    """Rows of the code-predictor checks, one per (dtype, batch)."""
    predictor, talker_hidden = code_predictor(geometry)
    cases = {batch: _inputs(batch, talker_hidden, seed=batch) for batch in batches}
    references = {batch: predictor.predict(*cases[batch], sampling(batch, "cpu")) for batch in batches}
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        fused = FusedCodePredictor(copy.deepcopy(predictor).to(device=device, dtype=dtype))
        bucketed, eager_buckets = BucketedCodePredictor(fused), BucketedCodePredictor(fused)
        if device.type == "cuda":
            bucketed.capture_all()
        for batch, (hidden, code0) in cases.items():
            greedy, reference = sampling(batch, "cpu").greedy, references[batch]
            inputs = (hidden.to(device, dtype), code0.to(device, dtype), sampling(batch, device))
            rng = _rng_states(device)
            codes = fused.predict(*inputs).cpu()
            replayed = bucketed.predict(*inputs).cpu()
            untouched_rng = all(torch.equal(a, b) for a, b in zip(rng, _rng_states(device), strict=True))
            # The replay against eager execution at the same (padded) shape: other shapes may take other kernels.
            replay_equal = torch.equal(replayed, eager_buckets.predict(*inputs).cpu())
            fresh_hidden, fresh_code0 = _inputs(batch, talker_hidden, seed=1000 + batch)
            fresh = (fresh_hidden.to(device, dtype), fresh_code0.to(device, dtype), sampling(batch, device, seed=5))
            fresh_equal = torch.equal(bucketed.predict(*fresh).cpu(), eager_buckets.predict(*fresh).cpu())
            rows.append(
                {
                    "check": "code_predictor",
                    "geometry": geometry,
                    "dtype": str(dtype).removeprefix("torch."),
                    "batch": batch,
                    "bucket": bucketed.bucket_size(batch),
                    "greedy_equal_share": float((codes[greedy] == reference[greedy]).float().mean()),
                    "greedy_codes": int(greedy.sum()) * codes.shape[1],
                    "sampled_equal_share": float((codes[~greedy] == reference[~greedy]).float().mean())
                    if (~greedy).any()
                    else None,
                    "graph_equal": replay_equal and fresh_equal,
                    "captured": bucketed.captured,
                    "global_rng_untouched": untouched_rng,
                    "eager_ms": _timed(device, lambda i=inputs, f=fused: f.predict(*i), repeats) * 1e3,
                    "graph_ms": _timed(device, lambda i=inputs, b=bucketed: b.predict(*i), repeats) * 1e3,
                }
            )
    return rows


def check_speed(geometry: str, device: torch.device, repeats: int, batches=SPEED_BATCHES) -> list[dict]:
    """Milliseconds per step back to back (greedy rows), eager (reference and fused) and replayed, in bf16 on a GPU
    (fp32 on the CPU); the kernels one step launches at B = 8."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    predictor, talker_hidden = code_predictor(geometry)
    predictor = predictor.to(device=device, dtype=dtype)
    fused = FusedCodePredictor(predictor)
    bucketed = BucketedCodePredictor(fused)
    if device.type == "cuda":
        bucketed.capture_all()
    rows = []
    for batch in batches:
        hidden, code0 = (t.to(device, dtype) for t in _inputs(batch, talker_hidden, seed=batch))
        inputs = (hidden, code0, dataclasses.replace(sampling(batch, device), all_greedy=True))
        runs = {name: lambda i=inputs, p=p: p.predict(*i)
                for name, p in (("reference", predictor), ("fused", fused), ("graph", bucketed))}  # fmt: skip
        seconds = {name: _timed(device, run, repeats) for name, run in runs.items()}
        graph_s = seconds["graph"]
        row = {"check": "code_predictor_speed", "geometry": geometry, "dtype": str(dtype).removeprefix("torch."),
               "batch": batch, "reference_ms": seconds["reference"] * 1e3, "eager_ms": seconds["fused"] * 1e3,
               "graph_ms": graph_s * 1e3, "graph_steps_per_s": 1 / graph_s,
               "graph_frames_per_s": batch / graph_s}  # fmt: skip
        if batch == 8 or batch == batches[0]:
            row["kernels"] = {name: kernels_per_step(device, run) for name, run in runs.items()}
        rows.append(row)
    return rows


def kernels_per_step(device: torch.device, run) -> int:
    """CUDA kernels one ``run()`` launches (the profiler's CUDA events: a graph replay counts its kernels, memcpy and
    memset included); on the CPU, ATen ops dispatched."""
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        run()
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            run()
            torch.cuda.synchronize(device)
        return sum(1 for event in trace.events() if event.device_type.name == "CUDA")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with Count():
        run()
    return Count.ops


def random_decoder(geometry: str, seed: int = 0) -> Qwen3TTSTokenizerV2Decoder:
    config = getattr(Qwen3TTSTokenizerV2DecoderConfig, geometry)()
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in Qwen3TTSTokenizerV2Decoder(config).state_dict().items()}
    decoder = Qwen3TTSTokenizerV2Decoder(config)
    decoder.load_weights(random_decoder_state(shapes, seed).items())
    decoder = decoder.eval().requires_grad_(False)
    decoder.precompute_snake_caches()
    return decoder


class DeviceStepRunner:
    """A :class:`Code2WavStep` on a device behind the runtime's ``StepRunner`` interface."""

    def __init__(self, step: Code2WavStep, device: torch.device) -> None:
        self.step, self.contract, self.device = step.to(device), step.contract, device

    def run(self, codes, freqs, cache_valid, cache):
        with torch.inference_mode():
            audio, cache_out = self.step(
                *(torch.from_numpy(a).to(self.device) for a in (codes, freqs, cache_valid, cache))
            )
        return audio.cpu().numpy(), cache_out.cpu().numpy()


def check_decoder(geometry: str, device: torch.device, frames: int, repeats: int) -> list[dict]:
    decoder = random_decoder(geometry)
    codes = torch.randint(0, decoder.config.codebook_size, (1, decoder.config.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(2))  # fmt: skip
    with torch.inference_mode():
        reference = decoder(codes)[0, 0].numpy()
        decoder.to(device)
        full = decoder(codes.to(device))[0, 0].cpu().numpy()
        full_s = _timed(device, lambda: decoder(codes.to(device)), repeats)
    stateful = StatefulDecoder(
        DeviceStepRunner(Code2WavStep(decoder, 16), device), first=DeviceStepRunner(Code2WavStep(decoder, 2), device)
    )
    stream = codes[0].T.numpy()
    start = time.perf_counter()
    audio = np.concatenate([stateful.feed(stream[i : i + 16]) for i in range(0, frames, 16)] + [stateful.flush()])
    step_s = (time.perf_counter() - start) / max(1, -(-frames // 16))
    rows = []
    for name, got, seconds in (("decoder_full", full, full_s), ("decoder_stateful", audio, step_s)):
        rows.append(
            {
                "check": name,
                "dtype": "float32",
                "batch": 16 if name == "decoder_stateful" else frames,
                "snr_db": float(snr_db(reference, got[: len(reference)])),
                "max_abs": float(np.abs(reference - got[: len(reference)]).max()),
                "samples_equal_length": len(got) == len(reference),
                "eager_ms": seconds * 1e3,
            }
        )
    return rows


def failures(rows: list[dict]) -> list[str]:
    """The required checks that failed, one line each."""
    bad = []
    for row in rows:
        name = f"{row['check']} {row.get('geometry', '')} {row['dtype']} B={row['batch']}".replace("  ", " ")
        if row["check"] == "code_predictor":
            share = row["greedy_equal_share"]
            if row["dtype"] == "float32" and share != 1.0:
                bad.append(f"{name}: greedy rows differ from the CPU in fp32 ({share:.3f} equal)")
            if not row["graph_equal"]:
                bad.append(f"{name}: the bucketed/replayed predictor differs from eager execution")
            if not row["global_rng_untouched"]:
                bad.append(f"{name}: the residual sampler touched torch's global RNG (CPU or CUDA)")
        elif row["check"].startswith("decoder") and (
            row["snr_db"] < MIN_DECODER_SNR_DB or not row["samples_equal_length"]
        ):
            bad.append(f"{name}: {row['snr_db']:.1f} dB against the CPU (want >= {MIN_DECODER_SNR_DB})")
    for geometry, share in bf16_agreement(rows).items():
        if share < MIN_BF16_AGREEMENT:
            bad.append(f"code_predictor {geometry} bfloat16: greedy codes agree with fp32's in {share:.3f} over all "
                       f"batches (want >= {MIN_BF16_AGREEMENT})")  # fmt: skip
    return bad


def bf16_agreement(rows: list[dict]) -> dict[str, float]:
    """Per geometry, the share of bf16 greedy codes equal to the fp32 CPU reference's, over all its batches."""
    equal: dict[str, float] = {}
    total: dict[str, int] = {}
    for row in rows:
        if row["check"] == "code_predictor" and row["dtype"] == "bfloat16":
            geometry, count = row.get("geometry", ""), row.get("greedy_codes", 1)
            equal[geometry] = equal.get(geometry, 0.0) + row["greedy_equal_share"] * count
            total[geometry] = total.get(geometry, 0) + count
    return {geometry: equal[geometry] / total[geometry] for geometry in equal if total[geometry]}


def _cell(value, fmt="{:.3f}"):
    return "" if value is None else fmt.format(value) if isinstance(value, float) else str(value)


def table(rows: list[dict]) -> str:
    lines = ["| check | geometry | dtype | B (bucket) | greedy equal | sampled equal | graph = eager | SNR dB | "
             "eager ms | graph ms |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        if row["check"] == "code_predictor_speed":
            continue
        bucket = f" ({row['bucket']})" if row.get("bucket") not in (None, row["batch"]) else ""
        lines.append(
            f"| {row['check']} | {row.get('geometry', '')} | {row['dtype']} | {row['batch']}{bucket} "
            f"| {_cell(row.get('greedy_equal_share'))} | {_cell(row.get('sampled_equal_share'))} "
            f"| {_cell(row.get('graph_equal'))} | {_cell(row.get('snr_db'), '{:.1f}')} "
            f"| {_cell(row['eager_ms'], '{:.2f}')} | {_cell(row.get('graph_ms'), '{:.2f}')} |"
        )
    speed = [row for row in rows if row["check"] == "code_predictor_speed"]
    if speed:
        lines += [
            "",
            "Code predictor step, back to back, greedy (ms; frames/s replayed; kernels: CUDA kernels per step, "
            "ATen ops on a CPU):",
            "| geometry | dtype | B | reference ms | fused eager ms | graph ms | graph steps/s | graph frames/s "
            "| kernels reference / fused / graph |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in speed:
            kernels = row.get("kernels")
            kernels = " / ".join(str(kernels[k]) for k in ("reference", "fused", "graph")) if kernels else ""
            lines.append(
                f"| {row['geometry']} | {row['dtype']} | {row['batch']} | {row['reference_ms']:.2f} "
                f"| {row['eager_ms']:.2f} | {row['graph_ms']:.2f} | {row['graph_steps_per_s']:.0f} "
                f"| {row['graph_frames_per_s']:.0f} | {kernels} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/gpu-check"))
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (every check but capture)")
    parser.add_argument("--geometry", choices=("released", "small"), default="released", help="random weights")
    parser.add_argument("--frames", type=int, default=100, help="decoder stream length (frames)")
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per row")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="code predictor batch sizes")
    parser.add_argument("--speed-batches", type=int, nargs="*", default=list(SPEED_BATCHES),
                        help="batch sizes of the speed rows (none: no speed rows)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        print(f"gpu_check: --device {args.device!r}: {error}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); pass --device cpu", file=sys.stderr)
        return 2
    if args.frames < 1 or args.repeats < 1 or min(args.batches + args.speed_batches) < 1:
        print("gpu_check: --frames, --repeats and --batches must be >= 1", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = []
    parts = []
    for geometry in GEOMETRIES[args.geometry]:
        parts.append((f"code predictor {geometry}",
                      lambda g=geometry: check_code_predictor(g, device, args.repeats, args.batches)))  # fmt: skip
        if args.speed_batches:
            parts.append((f"code predictor speed {geometry}",
                          lambda g=geometry: check_speed(g, device, args.repeats, args.speed_batches)))  # fmt: skip
    parts.append(("decoder", lambda: check_decoder(args.geometry, device, args.frames, args.repeats)))
    for part, run in parts:
        print(f"[gpu_check] {part} on {device} ({args.geometry}, random weights)", flush=True)
        rows += run()
    bad = failures(rows)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "geometry": args.geometry,
        "weights": "random",
        "seconds": time.perf_counter() - started,
        "rows": rows,
        "failures": bad,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(table(rows))
    for geometry, share in bf16_agreement(rows).items():
        print(f"bf16 greedy codes equal to fp32's ({geometry}, all batches): {share:.3f} (>= {MIN_BF16_AGREEMENT})")
    for line in bad:
        print(f"FAILED: {line}")
    print(
        f"[gpu_check] {len(rows)} rows, {len(bad)} failures, {report['seconds']:.0f} s -> {args.out / 'gpu_check.json'}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
