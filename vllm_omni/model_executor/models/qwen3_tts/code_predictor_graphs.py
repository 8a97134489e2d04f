"""The code predictor at static shapes, one batch bucket at a time: what a CUDA graph captures and replays.

A frame's residual codes take 15 dependent passes of a small transformer; on a GPU each pass is a
few dozen small kernels, so eager execution is bound by kernel launches. The predictor has no host
branching on values and no device-to-host read (``residual_sampler``), so one batch size can be
captured once and replayed: the rows of a step are copied into the static inputs of the smallest
bucket that holds them, the spare rows run greedy on zeros (rows never mix), and the first rows of
the static output are the step's codes.

:class:`BucketedCodePredictor` runs the same static-shape path with ``capture=False`` (CPU, or to
compare), so the padding and the bucket logic are checked where no GPU is. ``tools/gpu_check.py``
captures it on CUDA and checks the replay against eager execution. The engine runs the predictor
eagerly: vLLM 0.32 allows its model a CUDA graph only for the whole forward (the talker's forward
has per-request host work), and capturing inside its step would share the runner's stream and
memory pool; wiring the buckets into the engine waits for a GPU run of the engine itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .code_predictor import Qwen3TTSCodePredictor
from .residual_sampler import ResidualSampling

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class _Bucket:
    hidden: torch.Tensor
    code0: torch.Tensor
    sampling: ResidualSampling
    codes: torch.Tensor | None = None
    graph: object | None = None  # torch.cuda.CUDAGraph once captured


class BucketedCodePredictor:
    """``predict`` with the signature of :meth:`Qwen3TTSCodePredictor.predict`, at static batch sizes.

    ``capture``: record each bucket in a CUDA graph at its first use and replay it after (needs the
    predictor on a CUDA device); otherwise run each call eagerly on the bucket's static tensors.
    Batches larger than the largest bucket run eagerly as they are.
    """

    def __init__(
        self,
        predictor: Qwen3TTSCodePredictor,
        hidden_size: int,
        buckets: tuple[int, ...] = BUCKETS,
        capture: bool = False,
    ) -> None:
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be increasing sizes >= 1, got {buckets}")
        self.predictor, self.hidden_size, self.buckets, self.capture = predictor, hidden_size, buckets, capture
        self._buckets: dict[tuple[int, torch.dtype], _Bucket] = {}

    def bucket_size(self, rows: int) -> int | None:
        """The static batch size ``rows`` frames run at, or None beyond the largest bucket."""
        return next((size for size in self.buckets if size >= rows), None)

    def _bucket(self, size: int, dtype: torch.dtype, device: torch.device) -> _Bucket:
        key = (size, dtype)
        bucket = self._buckets.get(key)
        if bucket is None:
            zeros = torch.zeros(size, self.hidden_size, dtype=dtype, device=device)
            sampling = ResidualSampling(
                all_greedy=False,  # one graph for every mix of greedy and sampled rows
                greedy=torch.ones(size, dtype=torch.bool, device=device),
                temperature=torch.ones(size, dtype=torch.float32, device=device),
                top_k=torch.zeros(size, dtype=torch.int64, device=device),
                top_p=torch.ones(size, dtype=torch.float32, device=device),
                seeds=torch.zeros(size, dtype=torch.int64, device=device),
                frames=torch.zeros(size, dtype=torch.int64, device=device),
            )
            bucket = self._buckets[key] = _Bucket(zeros, zeros.clone(), sampling)
        return bucket

    def predict(self, hidden: torch.Tensor, code0_embeds: torch.Tensor, sampling: ResidualSampling) -> torch.Tensor:
        rows = hidden.shape[0]
        size = self.bucket_size(rows)
        if size is None:
            return self.predictor.predict(hidden, code0_embeds, sampling)
        bucket = self._bucket(size, hidden.dtype, hidden.device)
        self._load(bucket, rows, hidden, code0_embeds, sampling)
        if not self.capture:
            return self.predictor.predict(bucket.hidden, bucket.code0, bucket.sampling)[:rows].clone()
        if bucket.graph is None:
            self._record(bucket)
        bucket.graph.replay()
        return bucket.codes[:rows].clone()

    @staticmethod
    def _load(bucket: _Bucket, rows: int, hidden: torch.Tensor, code0: torch.Tensor, sampling: ResidualSampling):
        """The step's rows into the static inputs; the spare rows greedy on zeros (they never touch real rows)."""
        bucket.hidden[:rows] = hidden
        bucket.hidden[rows:] = 0
        bucket.code0[:rows] = code0
        bucket.code0[rows:] = 0
        static = bucket.sampling
        for name, spare in (("greedy", True), ("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)):
            getattr(static, name)[:rows] = getattr(sampling, name)
            getattr(static, name)[rows:] = spare
        for name in ("seeds", "frames"):
            getattr(static, name)[:rows] = getattr(sampling, name)
            getattr(static, name)[rows:] = 0

    def _record(self, bucket: _Bucket) -> None:
        """Capture the bucket (after warm-up passes on a side stream, as CUDA graph capture requires)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.predictor.predict(bucket.hidden, bucket.code0, bucket.sampling)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            bucket.codes = self.predictor.predict(bucket.hidden, bucket.code0, bucket.sampling)
        bucket.graph = graph
