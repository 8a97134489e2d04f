"""The server fetches reference audio only from public addresses, decided at the socket: every spelling of a
loopback, private or link-local host is refused before a connection reaches a listener, every redirect hop
included; an operator's allowed domain still works; no refusal quotes what was read or a server path.

The listener counts the connections it accepts (dual-stack, on every local address): the check is that it counts
zero, not only that an error came back.
"""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import urllib.parse
from pathlib import Path

import pytest

from vllm_omni.entrypoints.generation.egress import may_connect_to
from vllm_omni.entrypoints.generation.reference_fetch import MediaRules, ReferenceFetchError, fetch_reference

from ..listeners import CountingListener

pytestmark = pytest.mark.vllm  # aiohttp and yarl: the serving venv's


@pytest.fixture
def listener():
    counting = CountingListener()
    yield counting
    counting.close()


def fetch(url: str, **rules) -> bytes:
    return asyncio.run(fetch_reference(url, MediaRules(**{"max_bytes": 50_000, "timeout_s": 5.0, **rules})))


# Hosts that reach this machine or a private network however they are written (the port is the listener's).
SPELLINGS = [
    "127.0.0.1",
    "１２７.０.０.１",  # fullwidth digits and full stop: the URL library normalises them to 127.0.0.1
    "127。0。0。1",  # ideographic full stops
    "127．0．0．1",  # fullwidth full stops
    "127.0.0.1.",  # a trailing dot
    "127.1",  # short forms the resolver reads as 127.0.0.1
    "2130706433",
    "0x7f000001",
    "0177.0.0.1",
    "127.0.0.2",
    "0.0.0.0",
    "0",
    "localhost",
    "LOCALHOST.",
    "ｌｏｃａｌｈｏｓｔ",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::127.0.0.1]",  # IPv4-compatible
    "[64:ff9b::127.0.0.1]",  # NAT64
    "[fe80::1%25lo]",  # a zone id
]


@pytest.mark.parametrize("host", SPELLINGS)
def test_every_spelling_of_a_local_address_is_refused_before_any_connection(listener, host):
    with pytest.raises(ReferenceFetchError) as refused:
        fetch(f"http://{host}:{listener.port}/ref.wav")
    assert listener.accepted == 0, (host, str(refused.value))
    assert "could not be fetched" in str(refused.value) or "not a public address" in str(refused.value)


def test_the_loopback_spellings_are_refused_as_not_public(listener):
    for host in ("１２７.０.０.１", "127。0。0。1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0"):
        with pytest.raises(ReferenceFetchError, match="not a public address"):
            fetch(f"http://{host}:{listener.port}/ref.wav")
    assert listener.accepted == 0


def test_the_address_rule():
    public = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808"]
    local = [
        *("127.0.0.1", "127.255.255.254", "0.0.0.0", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254"),
        *("100.64.0.1", "192.0.0.170", "198.18.0.1", "224.0.0.1", "240.0.0.1", "255.255.255.255"),
        *("::1", "::", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "64:ff9b::7f00:1"),
        *("64:ff9b::a00:1", "2002:7f00:1::", "fe80::1", "fe80::1%eth0", "fd00::1", "ff02::1"),
        *("2001:0:4136:e378:8000:63bf:3fff:fdd2", "[::1]", "localhost", "", "1.2.3"),
        *("64:ff9b:1::a00:1", "fec0::1", "192.0.0.8"),  # local-use NAT64, site-local: global to Python 3.11
    ]
    assert [address for address in public if not may_connect_to(address)] == []
    assert [address for address in local if may_connect_to(address)] == []


class _Redirects(http.server.BaseHTTPRequestHandler):
    """``/audio``: 4 KB of audio-like bytes; ``/to?HOST``: a redirect to ``http://HOST:{target}/ref.wav``;
    ``/spelled``: a redirect to the same host written another way (fullwidth ``localhost``); ``/secret``: a
    redirect within the host to a path no answer may name, which is not there."""

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/audio":
            self.send_response(200)
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b"R" * 4096)
            return
        if self.path not in ("/spelled", "/secret") and "?" not in self.path:  # not there
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(302)
        if self.path == "/spelled":
            location = f"http://ｌｏｃａｌｈｏｓｔ:{port}/audio"
        elif self.path == "/secret":
            location = "/internal-signed-path-7f3a"
        else:
            location = f"http://{urllib.parse.unquote(self.path.split('?', 1)[1])}:{self.server.target}/ref.wav"
        self._headers_buffer.append(f"Location: {location}\r\n".encode())  # UTF-8, as servers send it raw
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_redirect_from_an_allowed_host_to_any_local_spelling_is_refused(listener):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirects)
    server.target = listener.port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    allowed = f"http://localhost:{server.server_address[1]}"
    try:
        assert fetch(allowed + "/audio", allowed_domains=("localhost",)) == b"R" * 4096  # the named host works
        assert fetch(allowed + "/spelled", allowed_domains=("LOCALHOST.",)) == b"R" * 4096  # the same host, spelled
        with pytest.raises(ReferenceFetchError) as missing:  # the Location read is never named
            fetch(allowed + "/secret", allowed_domains=("localhost",))
        assert "could not be fetched" in str(missing.value) and "internal-signed" not in str(missing.value)
        for host in SPELLINGS:
            with pytest.raises(ReferenceFetchError, match="redirects to another host|could not be fetched"):
                fetch(f"{allowed}/to?{host}", allowed_domains=("localhost",))
    finally:
        server.shutdown()
    assert listener.accepted == 0


MARKER = b"SECRET-MARKER-0123456789"


class _Leaky(http.server.BaseHTTPRequestHandler):
    """``/text``: a marker that is not audio; ``/gone``: a body with the marker and status 404."""

    def do_GET(self):
        self.send_response(200 if self.path == "/text" else 404)
        self.send_header("Content-Length", str(len(MARKER)))
        self.end_headers()
        self.wfile.write(MARKER)

    def log_message(self, *args):
        pass


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_no_refusal_quotes_a_byte_read_an_upstream_status_or_a_server_path(tmp_path: Path):
    from vllm_omni.entrypoints.generation.reference_decoding import load_reference_audio
    from vllm_omni.model_executor.models.qwen3_tts.reference_audio import ReferenceAudioError

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Leaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    root = tmp_path / "media"
    root.mkdir()
    (root / "secret.txt").write_bytes(MARKER)
    (tmp_path / "outside.wav").write_bytes(MARKER)
    messages = []
    try:
        text = fetch(base + "/text", allowed_domains=("127.0.0.1",))
        with pytest.raises(ReferenceAudioError) as not_audio:
            load_reference_audio(text)
        messages.append(str(not_audio.value))
        for url, rules in [
            (base + "/gone", {"allowed_domains": ("127.0.0.1",)}),
            (f"http://127.0.0.1:{closed_port()}/x", {"allowed_domains": ("127.0.0.1",)}),  # connection refused
            ((tmp_path / "outside.wav").as_uri(), {"local_root": root.resolve()}),
            ((root / "missing.wav").as_uri(), {"local_root": root.resolve()}),
            ((root / "secret.txt").as_uri(), {"local_root": root.resolve(), "max_bytes": 4}),
            (root.as_uri(), {"local_root": tmp_path.resolve()}),
        ]:
            with pytest.raises(ReferenceFetchError) as refused:
                fetch(url, **rules)
            messages.append(str(refused.value))
        local = fetch((root / "secret.txt").as_uri(), local_root=root.resolve())
        with pytest.raises(ReferenceAudioError) as not_audio:
            load_reference_audio(local)
        messages.append(str(not_audio.value))
    finally:
        server.shutdown()
    for message in messages:
        assert MARKER.decode() not in message and "SECRET" not in message, message
        assert str(tmp_path) not in message and "404" not in message and "refused" not in message.lower(), message
    assert "could not be fetched" in messages[1] and "could not be fetched" in messages[2]
    assert "not an accepted audio file" in messages[0] and "not an accepted audio file" in messages[-1]
