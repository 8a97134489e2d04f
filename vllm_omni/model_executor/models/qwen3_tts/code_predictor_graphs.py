"""The fused code predictor at static batch sizes, one bucket at a time: what a CUDA graph captures and replays.

A frame's residual codes take 15 dependent passes of a small transformer; on a GPU each pass is a
few dozen small kernels, so eager execution is bound by kernel launches. The fused predictor
(:mod:`.fused_code_predictor`) runs on static buffers with no host read and no branch on values, so
one batch size can be captured once and replayed: the rows of a step are copied into the static inputs
of the smallest bucket that holds them, the spare rows run greedy on zeros (rows never mix), and the
first rows of the static output are the step's codes.

:meth:`BucketedCodePredictor.capture_all` records every bucket, in two variants (every row greedy, which
skips the sampling work, and any mix), into one shared memory pool: the talker calls it when its weights
are loaded on a CUDA device, so no live step pays for a capture. Without capture (CPU, or to compare) the
buckets run eagerly at their static shapes, so the padding and the bucket choice are checked where no GPU
is; ``tools/gpu_check.py`` checks the replay against eager execution on a GPU.
"""

from __future__ import annotations

import torch

from .fused_code_predictor import FusedCodePredictor, load
from .residual_sampler import ResidualSampling

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class BucketedCodePredictor:
    """``predict`` with the signature of :meth:`FusedCodePredictor.predict`, at static batch sizes.

    Batches larger than the largest bucket run eagerly, padded to a multiple of it (a workspace per multiple, not
    per batch size). After :meth:`capture_all` (a CUDA device), every bucket replays its graph.
    """

    def __init__(self, fused: FusedCodePredictor, buckets: tuple[int, ...] = BUCKETS) -> None:
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be increasing sizes >= 1, got {buckets}")
        self.fused, self.buckets = fused, buckets
        self.spaces = {size: fused.new_workspace(size) for size in buckets}
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}  # (bucket, all greedy) -> graph

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def bucket_size(self, rows: int) -> int | None:
        """The static batch size ``rows`` frames run at, or None beyond the largest bucket."""
        return next((size for size in self.buckets if size >= rows), None)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, code0_embeds: torch.Tensor, sampling: ResidualSampling) -> torch.Tensor:
        rows = hidden.shape[0]
        size = self.bucket_size(rows)
        if size is None:
            space = self.fused.workspace(-(-rows // self.buckets[-1]) * self.buckets[-1])
        else:
            space = self.spaces[size]
        load(space, rows, hidden, code0_embeds, sampling)
        graph = self.graphs.get((size, sampling.all_greedy))
        if graph is None:
            self.fused.run(space, sampling.all_greedy)
        else:
            graph.replay()
        return space.codes[:rows].clone()

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Record every bucket, greedy and mixed, in one memory pool (after warm-up passes on a side stream,
        as CUDA graph capture requires). Needs the predictor on a CUDA device."""
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for space in self.spaces.values():
                for all_greedy in (True, False):
                    self.fused.run(space, all_greedy)
        torch.cuda.current_stream().wait_stream(side)
        for size, space in self.spaces.items():
            for all_greedy in (True, False):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.fused.run(space, all_greedy)
                self.graphs[(size, all_greedy)] = graph
