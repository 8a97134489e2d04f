"""Speak text while an LLM is still writing it: a simulated token stream piped into the edge client.

    .venv-vllm/bin/python examples/stream_text.py --server http://127.0.0.1:8000 --text "Hello there." --out speech.wav
    .venv-vllm/bin/python examples/stream_text.py --model CKPT --text "Hello there." --out speech.wav  # starts a server

The simulated LLM writes the text a word at a time (``--rate`` words per second) into the standard input of
``python -m vllm_omni.edge client --server URL --hardware cpu_x86_64 --text-stdin``, which sends every piece
into one talker request over the server's WebSocket (``"text_mode": "stream"``) and decodes the frames on this
device as they come: speech starts after the first words. The same pipe from a shell:

    python examples/stream_text.py --llm-only --text "Hello there." | \
        python -m vllm_omni.edge client --server URL --hardware cpu_x86_64 --text-stdin --voice Ryan --out speech.wav

With ``--model`` the server is started here (plans for cpu_x86_64 built at start-up under ``--artifacts``) and
stopped at the end, as in ``serve_and_stream.py``.
"""

import argparse
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def words(text):
    """The text as an LLM's tokens arrive: each word with its leading space."""
    return re.findall(r"\s*\S+", text)


def write_words(text, rate, out):
    for word in words(text):
        out.write(word.encode())
        out.flush()
        time.sleep(1 / rate)


def start_server(model, artifacts):
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([
        str(Path(sys.executable).parent / "vllm"), "serve", model, "--omni", "--edge-hardware", "cpu_x86_64",
        "--edge-artifacts", artifacts, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "1024", "--block-size", "32", "--kv-cache-memory-bytes", "256M",
    ])  # fmt: skip
    for _ in range(300):  # up to 10 minutes: plans are built before the engine starts
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return server, url
        except OSError:
            time.sleep(2)
    server.terminate()
    raise SystemExit("the server did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", required=True)
    parser.add_argument("--rate", type=float, default=5.0, help="words per second the simulated LLM writes")
    parser.add_argument("--llm-only", action="store_true", help="only write the words to stdout, with the delays")
    parser.add_argument("--server", help="a running `vllm serve --omni` server's URL")
    parser.add_argument("--model", help="or: start a server for this checkpoint")
    parser.add_argument("--artifacts", default="edge-artifacts")
    parser.add_argument("--voice", default="Ryan")
    parser.add_argument("--max-frames", default="200")
    parser.add_argument("--out", default="speech.wav")
    args = parser.parse_args()
    if args.llm_only:
        write_words(args.text, args.rate, sys.stdout.buffer)
        return
    if bool(args.server) == bool(args.model):
        raise SystemExit("give --server URL or --model CKPT")
    server, url = start_server(args.model, args.artifacts) if args.model else (None, args.server)
    try:
        client = subprocess.Popen([
            sys.executable, "-m", "vllm_omni.edge", "client", "--server", url, "--hardware", "cpu_x86_64",
            "--text-stdin", "--voice", args.voice, "--greedy", "--max-frames", args.max_frames, "--out", args.out,
        ], stdin=subprocess.PIPE)  # fmt: skip
        try:
            write_words(args.text, args.rate, client.stdin)
            client.stdin.close()  # end of the text: the client sends `end`
        except BrokenPipeError:
            pass  # the client is gone (the frame budget was spent before the text ended, or an error it reports)
        try:
            if client.wait(timeout=600) != 0:
                raise SystemExit(f"the client exited with {client.returncode}")
        finally:
            client.kill()  # still running after 10 minutes: no orphan (a no-op once it exited)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=120)


if __name__ == "__main__":
    main()
