"""A TCP listener that counts the connections reaching it: a test of the server's egress rule asserts zero."""

from __future__ import annotations

import socket
import threading


class CountingListener:
    """A TCP listener on every local IPv4 and IPv6 address that accepts, counts and closes connections."""

    def __init__(self) -> None:
        self.server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self.server.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.server.close()
