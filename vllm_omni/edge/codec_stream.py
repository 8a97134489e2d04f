"""``python -m vllm_omni.edge.codec_stream``: record or inspect a codec stream (:mod:`.cli.codec_stream`).

The protocol itself is :mod:`vllm_omni.edge.stream`.
"""

from .cli.codec_stream import main

if __name__ == "__main__":
    raise SystemExit(main())
