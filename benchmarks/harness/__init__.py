"""What every benchmark shares, one module per concern:

* :mod:`.checkpoints`: ``ensure_checkpoint``, the one random-weight checkpoint writer (kept across runs);
* :mod:`.server`: ``vllm_server``, a loopback ``vllm serve --omni`` for the run's length, and its metrics;
* :mod:`.processes`: ``run_worker`` (one process per runtime: thread pools of different runtimes fight on
  2 cores), ``peak_rss_mb``, ``rss_mb``;
* :mod:`.baseline`: the eager full decode that ratios are taken against, in a process of its own;
* :mod:`.report`: ``write_json``, ``table`` (Markdown), ``number``, ``plot``;
* :mod:`.playback`: the device's speaker (``PlaybackClock``) over a timeline of decoded audio.

Every import of a heavy library happens inside the function that needs it: a benchmark that keeps torch out
of its process (``bench_text_stream``) can use all of it, and so can the rknn and oracle venvs.
"""

from .baseline import count_macs, full_decode, time_full_decode
from .checkpoints import ensure_checkpoint
from .errors import BenchmarkError, run_cli
from .playback import speaker
from .processes import REPO_ROOT, peak_rss_mb, print_result, rss_mb, run_worker
from .report import number, plot, table, write_json
from .server import VllmServer, drain, metric, vllm_server

__all__ = [
    "REPO_ROOT",
    "BenchmarkError",
    "VllmServer",
    "count_macs",
    "drain",
    "ensure_checkpoint",
    "full_decode",
    "metric",
    "number",
    "peak_rss_mb",
    "plot",
    "print_result",
    "rss_mb",
    "run_cli",
    "run_worker",
    "speaker",
    "table",
    "time_full_decode",
    "vllm_server",
    "write_json",
]
