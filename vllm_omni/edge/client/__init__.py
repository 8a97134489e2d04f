"""The edge client, split by concern: :mod:`.transport` (streams and plans from files or URLs),
:mod:`.playback` (the speaker model), :mod:`.session` (one stream decoded with a plan). Its
command line is :mod:`vllm_omni.edge.cli.client` (``python -m vllm_omni.edge client``).

Device side: numpy, the plan's backend runtime (onnxruntime for the CPU classes) and this
package; no torch (``pip install 'vllm-omni-edge[client]' --no-deps`` plus numpy and onnxruntime).
"""

from .playback import PlaybackClock
from .session import ClientReport, EdgeClient
from .transport import DEFAULT_CACHE_DIR, fetch_plan, open_stream

__all__ = ["DEFAULT_CACHE_DIR", "ClientReport", "EdgeClient", "PlaybackClock", "fetch_plan", "open_stream"]
