"""Which web sites may reach this server, and through which names: parsed origins, the ``Host`` allow-list.

A server without ``--api-key`` trusts whoever can reach it, so it must not be reachable from a web page the
operator merely visits:

* **DNS rebinding**: a page at ``http://rebind.example:8000`` whose name later resolves to 127.0.0.1 is
  same-origin with a local server and reads its answers. Its requests still carry ``Host: rebind.example:8000``,
  so the server answers only the names it is known by (:meth:`SitePolicy.host_allowed`): IP literals,
  ``localhost`` (and ``*.localhost``, which resolvers keep on the loopback), the ``--host`` it binds, the hosts of
  ``--speech-allowed-origins`` and ``--speech-allowed-hosts`` (``*``: any name, for a proxy that checks names
  itself).
* **Cross-site reads and writes**: vLLM's CORS answers ``*`` by default, and a form or a ``text/plain`` fetch
  needs no preflight, so a request with an ``Origin`` is accepted only from the server's own origin or an allowed
  one (:meth:`SitePolicy.origin_allowed`; the WebSocket handshake follows the same rule).

Origins are parsed (scheme, host, port), never compared as strings: ``https://http://localhost:8000`` is no
origin, and ``null`` (sandboxed frames, ``file:`` pages) is refused as a setting because it would admit them all.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Origin:
    """A web origin: ``scheme://host[:port]`` (host lowercased, IPv6 without brackets, the port explicit)."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_origin(text: str) -> Origin:
    """``text`` (an ``Origin`` header, or a ``--speech-allowed-origins`` entry) as an :class:`Origin`; raises
    ``ValueError`` saying what an origin looks like."""
    value = text.strip().rstrip("/")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in DEFAULT_PORTS
        or not parts.hostname
        or parts.path
        or parts.query
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
    ):
        raise ValueError(f"{text!r} is not a web origin: expected http(s)://host[:port] (no path, no user)")
    return Origin(parts.scheme, parts.hostname.lower().rstrip("."), port or DEFAULT_PORTS[parts.scheme])


def split_host(header: str) -> tuple[str, int | None] | None:
    """A ``Host`` header as ``(name, port)`` (name lowercased, IPv6 without brackets), or None if malformed."""
    header = header.strip().lower()
    try:
        parts = urlsplit(f"//{header}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.fragment or parts.username is not None:
        return None
    return parts.hostname, port


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class SitePolicy:
    """The names this server answers to and the origins whose pages may change its state (see the module)."""

    allowed_origins: tuple[Origin, ...] = ()
    allowed_hosts: tuple[str, ...] = ()  # names (lowercased); "*": any name

    @classmethod
    def from_settings(cls, origins: str | None, hosts: str | None, bind_host: str | None = None) -> SitePolicy:
        """The policy of ``--speech-allowed-origins`` / ``--speech-allowed-hosts`` (comma-separated) and the
        ``--host`` the server binds; raises ``ValueError`` naming the entry that is wrong."""
        parsed = []
        for entry in (origins or "").split(","):
            if not entry.strip():
                continue
            if entry.strip().lower() == "null":
                raise ValueError(
                    "--speech-allowed-origins (or vLLM's --allowed-origins): 'null' is the origin of every sandboxed "
                    "frame and file: page; "
                    "name the http(s) origins that may reach this server instead"
                )
            try:
                parsed.append(parse_origin(entry))
            except ValueError as error:
                raise ValueError(f"--speech-allowed-origins (or vLLM's --allowed-origins): {error}") from None
        names = [name.strip().lower().rstrip(".") for name in (hosts or "").split(",") if name.strip()]
        for name in names:
            if name != "*" and (split_host(name) is None or split_host(name)[1] is not None):
                raise ValueError(f"--speech-allowed-hosts: {name!r} is not a host name (no scheme, no port)")
        bind = (bind_host or "").strip().lower().rstrip(".")
        if bind and not is_ip_literal(bind.strip("[]")):
            names.append(bind)
        return cls(tuple(parsed), tuple(dict.fromkeys(names)))

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` names this server (a request without one is no browser's: allowed)."""
        if header is None:
            return True
        if "*" in self.allowed_hosts:
            return True
        split = split_host(header)
        if split is None:
            return False
        name = split[0].rstrip(".")
        return (
            is_ip_literal(name)
            or name == "localhost"
            or name.endswith(".localhost")
            or name in self.allowed_hosts
            or any(origin.host == name for origin in self.allowed_origins)
        )

    def origin_allowed(self, header: str | None, host: str | None) -> bool:
        """Whether a request with ``Origin: header`` may change state: none (not a browser), the server's own
        (the request's ``Host``, http or https: behind a TLS proxy the page is https while this hop is not), or
        an allowed origin."""
        if header is None:
            return True
        try:
            origin = parse_origin(header)
        except ValueError:
            return False  # "null" and anything malformed
        if origin in self.allowed_origins:
            return True
        split = split_host(host) if host else None
        if split is None:
            return False
        name, port = split
        default_ports = (None, *DEFAULT_PORTS.values())  # either scheme's default port: a TLS proxy in front
        same_port = origin.port == port or (port in default_ports and origin.port in default_ports)
        return origin.host == name.rstrip(".") and same_port
