"""Audio files made for the tests with FFmpeg's encoders (PyAV: the serving venv)."""

from __future__ import annotations

import io

import numpy as np


def encoded(fmt: str, codec: str, rate: int, channels: int, seconds: float, sample_format: str = "s16") -> bytes:
    """``seconds`` of silence coded by FFmpeg's ``codec`` in a ``fmt`` container."""
    import av

    buffer = io.BytesIO()
    layout = {1: "mono", 2: "stereo", 3: "3.0", 8: "7.1"}[channels]
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        samples = int(rate * seconds)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, samples * channels), np.int16), format=sample_format, layout=layout
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()
