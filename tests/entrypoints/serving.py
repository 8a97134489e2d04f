"""A loopback ``vllm serve CKPT --omni`` for the serving tests, and a client of it."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from vllm_omni.edge.stream import FrameBatch, iter_events
from vllm_omni.testing.serve import ServerStartError, vllm_serve

KEY = "test-key-123"
# The tiny talker's engine: fp32, eager, a 64 MB KV cache (docs/serving/serve.md: CPU memory).
ENGINE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--block-size", "32"]
ENGINE_ARGS += ["--kv-cache-memory-bytes", str(64 << 20)]


def bearer(key: str) -> str:
    """``key`` as the WebSocket subprotocol a browser offers it in (``bearer.<base64url>``, no padding), as
    ``web/page/app.mjs`` writes it and ``vllm_omni.entrypoints.websocket.socket_auth`` reads it."""
    return "bearer." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


class Server:
    def __init__(self, url: str, artifacts: Path, process: subprocess.Popen, log: Path) -> None:
        self.url, self.artifacts, self.process, self.log = url, artifacts, process, log

    def request(self, path: str, body: dict | None = None, key: str | None = KEY, headers: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=dict(headers or {}))
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        return urllib.request.urlopen(request, timeout=120)

    def error(self, path: str, body: dict | None = None, key: str | None = KEY) -> tuple[int, str]:
        with pytest.raises(urllib.error.HTTPError) as info:
            self.request(path, body, key)
        return info.value.code, info.value.read().decode()

    def codec_frames(self, body: dict) -> np.ndarray:
        with self.request("/v1/audio/speech", {**body, "response_format": "codec", "edge_hardware": "cpu_x86_64"}) as r:
            events = list(iter_events(io.BytesIO(r.read())))
        frames = [event.frames for event in events if isinstance(event, FrameBatch) and len(event.frames)]
        return np.concatenate(frames) if frames else np.zeros((0, 16), dtype=np.int64)


@contextlib.contextmanager
def running_server(
    checkpoint: Path,
    work: Path,
    hardware: str,
    extra_args: list[str],
    env: dict[str, str] | None = None,
    key: str | None = KEY,
) -> Iterator[Server]:
    """``vllm serve checkpoint --omni --edge-hardware hardware`` (the test kit's launcher; plans under
    ``work/artifacts``, log in ``work/server.log``, ``env`` added to the environment) behind ``key`` (None: a server
    without one), once ``/health`` answers; terminated on exit."""
    log = work / "server.log"
    args = [*(["--api-key", key] if key else []), *ENGINE_ARGS, *extra_args]
    try:
        served = vllm_serve(checkpoint, hardware=hardware, artifacts=work / "artifacts", log=log, args=args, env=env)
        with served as (process, url):
            yield Server(url, work / "artifacts", process, log)
    except ServerStartError as error:
        pytest.fail(str(error))


def as_recording(messages: list) -> list:
    """A WebSocket session's messages as events of the wire protocol (the parser checks order, counts, totals)."""
    from vllm_omni.edge.stream import KIND_BINARY, KIND_JSON, RECORDING_MAGIC, record

    data = RECORDING_MAGIC + b"".join(
        record(KIND_BINARY, m) if isinstance(m, bytes) else record(KIND_JSON, m.encode()) for m in messages
    )
    return list(iter_events(io.BytesIO(data)))


def client_speaks_the_full_decode(
    server: Server, checkpoint: Path, work: Path, say: list[str], body: dict, frames: int, stdin: list[str] = ()
) -> np.ndarray:
    """Run the edge client (``say``: its text/voice arguments; ``stdin``: pieces written to its standard input
    50 ms apart, for ``--text-stdin``) against ``server``, and check its audio is the full decode of the frames the
    server sends for ``body`` (>= 90 dB as 16-bit PCM); returns those frames."""
    import torch

    from vllm_omni.edge.audio import float_to_pcm16, snr_db
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    out = work / "speech.wav"
    command = [sys.executable, "-m", "vllm_omni.edge", "client", "--server", server.url, "--hardware", "cpu_x86_64"]
    command += [*say, "--greedy", "--max-frames", str(frames), "--api-key", KEY]
    command += ["--out", str(out), "--cache-dir", str(work / "cache")]
    with open(work / "client.log", "wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        try:
            for piece in stdin:
                process.stdin.write(piece.encode())
                process.stdin.flush()
                time.sleep(0.05)
            process.stdin.close()
            process.wait(timeout=300)
        finally:
            process.kill()
    assert process.returncode == 0, (work / "client.log").read_text(errors="replace")[-3000:]
    sent = server.codec_frames({**body, "max_frames": frames})
    with torch.inference_mode():
        reference = load_code2wav_decoder(checkpoint)(torch.from_numpy(sent).T[None]).numpy().ravel()
    with wave.open(str(out)) as handle:
        heard = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    assert heard.size == reference.size
    assert snr_db(float_to_pcm16(reference).astype(np.float64), heard.astype(np.float64)) >= 90
    return sent


def marker_plugin(root: Path) -> tuple[Path, Path]:
    """A tiny installed vLLM general plugin (an entry point in a ``.dist-info`` under ``root``, for PYTHONPATH) that
    appends its process id to a marker file whenever vLLM loads it: (the PYTHONPATH folder, the marker)."""
    site, marker = root / "site", root / "loaded.txt"
    info = site / "marker_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: marker-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nmarker_plugin = marker_plugin:register\n")
    (site / "marker_plugin.py").write_text(
        "import os\n\ndef register():\n"
        f"    with open({str(marker)!r}, 'a') as out:\n"
        "        out.write(f'{os.getpid()}\\n')\n"
    )
    return site, marker
