"""The talker's and the decoder's device-side parts on a GPU, in plain torch (no vLLM, no transformers).

    python tools/gpu_check.py --out out/gpu-check [--device cuda] [--geometry released|small]
    make gpu-check

A lent GPU machine has torch with CUDA but no vLLM and no registry, so this checks the parts of a GPU
server that are plain torch, at the released sizes with RANDOM WEIGHTS:

* the code predictor with the residual sampler, batched (B = 1, 4, 16), on the device in fp32 and bf16
  against the CPU in fp32: greedy rows must be equal in fp32 (bf16 agreement is reported); sampled
  rows use the counter-based uniforms, so they agree wherever the scores do (reported);
* the code predictor captured in a CUDA graph per batch bucket (``BucketedCodePredictor``) and replayed:
  equal to eager execution on the device, code for code;
* the speech-tokenizer decoder's full decode and its stateful step decode (B = 16 after a first step of 2)
  on the device against the CPU full decode: SNR in dB and max-abs difference;
* step times: the code predictor eager and replayed per batch size, the decoder's step.

``--device cpu`` runs every check but the capture (the buckets run eagerly at their static shapes): the
CPU tests run it so (``tests/tools/test_gpu_check.py``). Writes ``gpu_check.json`` and prints a table;
exits 1 when a required check fails, 2 on bad arguments or a missing device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_omni.edge.audio import snr_db
from vllm_omni.edge.graphs.stateful import Code2WavStep
from vllm_omni.edge.runtime.stateful_decoder import StatefulDecoder
from vllm_omni.edge.testing.random_weights import random_decoder_state
from vllm_omni.model_executor.models.qwen3_tts.code_predictor import Qwen3TTSCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.code_predictor_graphs import BucketedCodePredictor
from vllm_omni.model_executor.models.qwen3_tts.residual_sampler import ResidualSampling
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)

BATCHES = (1, 4, 16)
MIN_DECODER_SNR_DB = 60.0  # fp32 on two devices: kernels differ in summation order, not in the result
# The code predictor of the released checkpoints (0.6B and 1.7B: Qwen3TTSCodePredictorConfig's defaults), and a
# small one with every structural feature (GQA, a projection from a wider talker) for the CPU tests.
PREDICTORS = {
    "released": {"talker_hidden": 1024, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                 "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "small": {"talker_hidden": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
}  # fmt: skip


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


def check_code_predictor(geometry: str, device: torch.device, repeats: int, batches=BATCHES) -> list[dict]:
    """Rows of the code-predictor checks, one per (dtype, batch)."""
    predictor, talker_hidden = code_predictor(geometry)
    generator = torch.Generator().manual_seed(1)
    rows = []
    for batch in batches:
        hidden = torch.randn(batch, talker_hidden, generator=generator)
        code0 = torch.randn(batch, talker_hidden, generator=generator)
        reference = predictor.predict(hidden, code0, sampling(batch, "cpu"))
        greedy = sampling(batch, "cpu").greedy
        for dtype in (torch.float32, torch.bfloat16):
            on_device = predictor.to(device=device, dtype=dtype)
            inputs = (hidden.to(device, dtype), code0.to(device, dtype), sampling(batch, device))
            rng = torch.get_rng_state()
            codes = on_device.predict(*inputs).cpu()
            untouched_rng = torch.equal(rng, torch.get_rng_state())
            eager_s = _timed(device, lambda on_device=on_device, inputs=inputs: on_device.predict(*inputs), repeats)
            bucketed = BucketedCodePredictor(on_device, talker_hidden, capture=device.type == "cuda")
            replayed = bucketed.predict(*inputs).cpu()
            replay_s = _timed(device, lambda bucketed=bucketed, inputs=inputs: bucketed.predict(*inputs), repeats)
            rows.append(
                {
                    "check": "code_predictor",
                    "dtype": str(dtype).removeprefix("torch."),
                    "batch": batch,
                    "greedy_equal_share": float((codes[greedy] == reference[greedy]).float().mean()),
                    "sampled_equal_share": float((codes[~greedy] == reference[~greedy]).float().mean())
                    if (~greedy).any()
                    else None,
                    "graph_equal": bool(torch.equal(replayed, codes)),
                    "captured": bucketed.capture,
                    "global_rng_untouched": untouched_rng,
                    "eager_ms": eager_s * 1e3,
                    "graph_ms": replay_s * 1e3,
                }
            )
        predictor.to(device="cpu", dtype=torch.float32)
    return rows


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
        name = f"{row['check']} {row['dtype']} B={row['batch']}"
        if row["check"] == "code_predictor":
            if row["dtype"] == "float32" and row["greedy_equal_share"] != 1.0:
                bad.append(f"{name}: greedy rows differ from the CPU in fp32 ({row['greedy_equal_share']:.3f} equal)")
            if not row["graph_equal"]:
                bad.append(f"{name}: the bucketed/replayed predictor differs from eager execution")
            if not row["global_rng_untouched"]:
                bad.append(f"{name}: the residual sampler touched torch's global RNG")
        elif row["snr_db"] < MIN_DECODER_SNR_DB or not row["samples_equal_length"]:
            bad.append(f"{name}: {row['snr_db']:.1f} dB against the CPU (want >= {MIN_DECODER_SNR_DB})")
    return bad


def table(rows: list[dict]) -> str:
    lines = ["| check | dtype | B | greedy equal | sampled equal | graph = eager | SNR dB | eager ms | graph ms |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def cell(value, fmt="{:.3f}"):
        return "" if value is None else fmt.format(value) if isinstance(value, float) else str(value)

    for row in rows:
        lines.append(
            f"| {row['check']} | {row['dtype']} | {row['batch']} | {cell(row.get('greedy_equal_share'))} "
            f"| {cell(row.get('sampled_equal_share'))} | {cell(row.get('graph_equal'))} "
            f"| {cell(row.get('snr_db'), '{:.1f}')} | {cell(row['eager_ms'], '{:.2f}')} "
            f"| {cell(row.get('graph_ms'), '{:.2f}')} |"
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
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        print(f"gpu_check: --device {args.device!r}: {error}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); pass --device cpu", file=sys.stderr)
        return 2
    if args.frames < 1 or args.repeats < 1 or min(args.batches) < 1:
        print("gpu_check: --frames, --repeats and --batches must be >= 1", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = []
    for part, run in (
        ("code predictor", lambda: check_code_predictor(args.geometry, device, args.repeats, args.batches)),
        ("decoder", lambda: check_decoder(args.geometry, device, args.frames, args.repeats)),
    ):
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
    for line in bad:
        print(f"FAILED: {line}")
    print(
        f"[gpu_check] {len(rows)} rows, {len(bad)} failures, {report['seconds']:.0f} s -> {args.out / 'gpu_check.json'}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
