"""Benchmarks: each module measures one thing and runs as ``python -m benchmarks.bench_NAME`` from the repository
root; what they share (checkpoints, servers, worker processes, the baseline decode, reports, the speaker model)
is :mod:`benchmarks.harness`. Benchmarks import the harness and the library, never each other."""
