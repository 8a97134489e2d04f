"""Serve a model with `vllm serve --omni`, then stream speech to a device on loopback and decode it there.

    .venv-vllm/bin/python examples/serve_and_stream.py --model CKPT --text "Hello there." --out speech.wav

Starts the server (plans for cpu_x86_64 built at start-up under --artifacts), waits for it, runs the
edge client against it (plan + artifacts downloaded, stream decoded locally), and stops the server.
"""

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--voice", default="Ryan")
    parser.add_argument("--out", required=True)
    parser.add_argument("--artifacts", default="edge-artifacts")
    parser.add_argument("--max-frames", default="100")
    args = parser.parse_args()

    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen([
        str(bin_dir / "vllm"), "serve", args.model, "--omni", "--edge-hardware", "cpu_x86_64",
        "--edge-artifacts", args.artifacts, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "1024", "--block-size", "32", "--kv-cache-memory-bytes", "256M",
    ])  # fmt: skip
    try:
        for _ in range(300):  # up to 10 minutes: plans are built before the engine starts
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}")
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                time.sleep(2)
        else:
            raise SystemExit("the server did not come up")
        subprocess.run([
            sys.executable, "-m", "vllm_omni.edge", "client", "--server", url, "--hardware", "cpu_x86_64",
            "--text", args.text, "--voice", args.voice, "--greedy", "--max-frames", args.max_frames, "--out", args.out,
        ], check=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
