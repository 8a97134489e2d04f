"""Which addresses this server may open a connection to on a client's say-so (a ``ref_audio`` URL): the one rule,
read at the socket, after every normalisation a URL library or a resolver may apply.

A check of the URL's host string is not a check of the connection: the HTTP client re-parses the URL (IDNA and
Unicode: ``１２７.０.０.１`` and ``127。0。0。1`` become ``127.0.0.1``), a resolver reads forms the check did not
(``0177.0.0.1``, ``2130706433``), and an IP literal is connected to without asking any resolver. So every
outbound socket is made by :func:`checked_socket_factory`, which refuses before ``connect()`` an address that
:func:`may_connect_to` does not allow, as egress proxies check the peer address rather than the name
(OWASP's SSRF prevention cheat sheet: validate after every normalisation, deny by default).

Allowed: globally routable unicast addresses only. Refused: loopback, private, link-local, shared (CGNAT),
unspecified (``0.0.0.0``, ``::``), multicast and reserved ranges, and any IPv6 address that carries an IPv4 one
which is refused (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4,
Teredo). An IPv6 zone id (``fe80::1%eth0``) is dropped before the check: the address alone decides.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix: the low 32 bits are IPv4
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291's deprecated IPv4-compatible addresses
# Ranges refused whatever the interpreter's ipaddress tables say (Python 3.11 counts these as global): RFC 8215's
# local-use NAT64 prefix (it reaches a site's own IPv4 network), site-local IPv6, IETF protocol assignments.
ALWAYS_REFUSED = tuple(ipaddress.ip_network(network) for network in ("64:ff9b:1::/48", "fec0::/10", "192.0.0.0/24"))


class EgressRefused(OSError):
    """A connection this server does not open: its peer address is not a public one. An ``OSError`` so that the
    HTTP client treats it as the failed connect it is (and tries the name's next address, if any)."""

    def __init__(self, address: str) -> None:
        super().__init__(f"connecting to {address} is refused: not a public address")
        self.address = address


def may_connect_to(address: str) -> bool:
    """Whether this server may connect to ``address`` (an IP address as a socket or resolver gives it, with or
    without an IPv6 zone id) for a client: False for anything that is not a global unicast address, and for
    anything that does not parse."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    return all(_public(view) for view in _views(ip))


def _views(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Iterator[Any]:
    """What a connection to ``ip`` reaches: an IPv6 address that stands for an IPv4 one (mapped, NAT64,
    IPv4-compatible) is that IPv4 address alone (a NAT64 network reaches public hosts through ``64:ff9b::``);
    any other is itself and every IPv4 address it tunnels to (6to4, Teredo)."""
    if isinstance(ip, ipaddress.IPv4Address):
        yield ip
        return
    if ip.ipv4_mapped is not None:
        yield ip.ipv4_mapped
        return
    if ip in NAT64_PREFIX or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        yield ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        return
    yield ip
    if ip.sixtofour is not None:
        yield ip.sixtofour
    if ip.teredo is not None:
        yield from ip.teredo


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if any(ip.version == network.version and ip in network for network in ALWAYS_REFUSED):
        return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_loopback)


class CheckedSockets:
    """A socket factory for the HTTP client's connector (aiohttp's ``socket_factory``, called with each address
    it is about to connect to): the socket, or :class:`EgressRefused` before any packet leaves when
    :func:`may_connect_to` does not allow the address (``refused`` lists those). ``any_address``: the host is one
    the operator named (``--allowed-media-domains``), which may be private."""

    def __init__(self, any_address: bool = False) -> None:
        self.any_address = any_address
        self.refused: list[str] = []

    def __call__(self, addr_info: tuple) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        if not self.any_address and not may_connect_to(address):
            self.refused.append(address)
            raise EgressRefused(address)
        return socket.socket(family=family, type=kind, proto=proto)
