"""A client's reference audio fetched from the URL it gave (``ref_audio`` as ``http(s)://`` or ``file://``).

The rules are vLLM's for media inputs, read from the served engine's own settings, with what a speech server
must add because the fetch happens on a client's say-so:

* ``--allowed-media-domains``: when given, only those hosts (vLLM's rule); ``--allowed-local-media-path``: a
  ``file://`` URL must lie under it (symbolic links resolved), and without it ``file://`` is refused (vLLM's rule);
* ``VLLM_AUDIO_FETCH_TIMEOUT`` (seconds, vLLM's) bounds the whole fetch; the bytes are bounded by the server's
  upload limit (``--speech-max-body-bytes``), by ``Content-Length`` and as they arrive;
* no private, loopback, link-local or otherwise non-global address unless its host is one the operator named in
  ``--allowed-media-domains``: every address a name resolves to is checked by the resolver that the connection
  then uses (no second lookup to rebind), and an IP literal is checked as written;
* redirects (``VLLM_MEDIA_URL_ALLOW_REDIRECTS``, vLLM's, on by default) are followed at most
  :data:`MAX_REDIRECTS` times and only within the same scheme, host and port: a redirect elsewhere is refused.

Every refusal is a :class:`ReferenceFetchError` (a 400 saying which rule and what to do).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

MAX_REDIRECTS = 3
CHUNK_BYTES = 64 << 10


class ReferenceFetchError(SpeechRequestError):
    """``ref_audio``'s URL cannot be fetched under the server's media rules (a 400)."""


@dataclass(frozen=True)
class MediaRules:
    """Where reference audio may come from, and how much of it."""

    max_bytes: int
    allowed_domains: tuple[str, ...] = ()
    local_root: Path | None = None
    timeout_s: float = 10.0
    follow_redirects: bool = True

    @classmethod
    def for_engine(cls, model_config: Any, max_bytes: int) -> MediaRules:
        """The served engine's media settings (``--allowed-media-domains``, ``--allowed-local-media-path``) and
        vLLM's environment (fetch timeout, redirects)."""
        import vllm.envs as envs

        root = getattr(model_config, "allowed_local_media_path", "") or ""
        return cls(
            max_bytes=max_bytes,
            allowed_domains=tuple(d.lower() for d in getattr(model_config, "allowed_media_domains", None) or ()),
            local_root=Path(root).resolve() if root else None,
            timeout_s=float(envs.VLLM_AUDIO_FETCH_TIMEOUT),
            follow_redirects=bool(envs.VLLM_MEDIA_URL_ALLOW_REDIRECTS),
        )

    def named(self, host: str) -> bool:
        return host.lower() in self.allowed_domains


def is_public(address: str) -> bool:
    """Whether ``address`` (an IP literal) is a global unicast address (IPv4-mapped IPv6 read as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def fetch_reference(url: str, rules: MediaRules) -> bytes:
    """The bytes at ``url`` (``http(s)://`` or ``file://``) under ``rules``; :class:`ReferenceFetchError` otherwise."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return await asyncio.to_thread(_read_local, parts, rules)
    if scheme not in ("http", "https"):
        raise ReferenceFetchError(f"ref_audio: {scheme}:// URLs are not fetched; send http(s)://, file:// or data:")
    try:
        async with asyncio.timeout(rules.timeout_s):
            return await _fetch_http(url, rules)
    except TimeoutError:
        raise ReferenceFetchError(
            f"ref_audio: {_shown(url)} did not arrive within {rules.timeout_s:g} s (VLLM_AUDIO_FETCH_TIMEOUT)"
        ) from None


def _shown(url: str) -> str:
    """``url`` without its query and credentials, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _check_host(parts: urllib.parse.SplitResult, rules: MediaRules) -> None:
    host = (parts.hostname or "").lower()
    if not host:
        raise ReferenceFetchError("ref_audio: the URL names no host")
    if rules.allowed_domains and not rules.named(host):
        raise ReferenceFetchError(
            f"ref_audio: {host} is not among the allowed media domains ({', '.join(rules.allowed_domains)}; "
            "--allowed-media-domains)"
        )
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None and not rules.named(host) and not is_public(str(literal)):
        raise _private(host)


def _private(host: str) -> ReferenceFetchError:
    return ReferenceFetchError(
        f"ref_audio: {host} is a private, loopback or link-local address; this server fetches reference audio from "
        "public addresses only, unless the host is named in --allowed-media-domains"
    )


def _resolver(rules: MediaRules) -> Any:
    """aiohttp's resolver with every address checked: the connection uses exactly the addresses checked here."""
    from aiohttp.resolver import DefaultResolver

    class PublicOnly(DefaultResolver):
        async def resolve(self, name: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
            found = await super().resolve(name, port, family)
            if not rules.named(name) and not all(is_public(entry["host"]) for entry in found):
                raise _private(name)
            return found

    return PublicOnly()


async def _fetch_http(url: str, rules: MediaRules) -> bytes:
    import aiohttp

    for _hop in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        _check_host(parts, rules)
        connector = aiohttp.TCPConnector(resolver=_resolver(rules), use_dns_cache=False)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, trust_env=False) as session,
                session.get(url, allow_redirects=False) as response,
            ):
                if response.status in (301, 302, 303, 307, 308):
                    url = _redirect(url, response.headers.get("Location"), rules)
                    continue
                if response.status != 200:
                    raise ReferenceFetchError(f"ref_audio: {_shown(url)} answered HTTP {response.status}")
                return await _read_bounded(response, url, rules.max_bytes)
        # The resolver's refusal (a ReferenceFetchError) reaches here as it was raised: aiohttp wraps OSErrors only.
        except aiohttp.ClientConnectorError as error:
            raise ReferenceFetchError(f"ref_audio: cannot connect to {_shown(url)} ({error.os_error})") from None
        except (aiohttp.ClientError, OSError) as error:
            raise ReferenceFetchError(f"ref_audio: fetching {_shown(url)} failed ({type(error).__name__})") from None
    raise ReferenceFetchError(f"ref_audio: more than {MAX_REDIRECTS} redirects")


def _redirect(url: str, location: str | None, rules: MediaRules) -> str:
    if not rules.follow_redirects:
        raise ReferenceFetchError(f"ref_audio: {_shown(url)} redirects, and VLLM_MEDIA_URL_ALLOW_REDIRECTS is off")
    if not location:
        raise ReferenceFetchError(f"ref_audio: {_shown(url)} redirects without a Location")
    target = urllib.parse.urljoin(url, location)
    here, there = urllib.parse.urlsplit(url), urllib.parse.urlsplit(target)
    if (here.scheme, here.hostname, here.port) != (there.scheme.lower(), there.hostname, there.port):
        raise ReferenceFetchError(
            f"ref_audio: {_shown(url)} redirects to another host ({_shown(target)}); only redirects within the same "
            "host are followed: give the final URL"
        )
    return target


async def _read_bounded(response: Any, url: str, limit: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > limit:
        raise _too_big(url, declared, limit)
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise _too_big(url, f"over {limit}", limit)
        chunks.append(chunk)
    if not size:
        raise ReferenceFetchError(f"ref_audio: {_shown(url)} is empty")
    return b"".join(chunks)


def _too_big(url: str, size: Any, limit: int) -> ReferenceFetchError:
    return ReferenceFetchError(
        f"ref_audio: {_shown(url)} is {size} bytes; this server takes at most {limit} (--speech-max-body-bytes)"
    )


def _read_local(parts: urllib.parse.SplitResult, rules: MediaRules) -> bytes:
    if rules.local_root is None:
        raise ReferenceFetchError("ref_audio: file:// URLs need the server started with --allowed-local-media-path")
    if parts.netloc not in ("", "localhost"):
        raise ReferenceFetchError(f"ref_audio: a file:// URL names no host (got {parts.netloc!r})")
    path = Path(urllib.parse.unquote(parts.path)).resolve()
    if rules.local_root not in path.parents:
        raise ReferenceFetchError(f"ref_audio: the file must lie under --allowed-local-media-path ({rules.local_root})")
    if not path.is_file():  # a FIFO or a device would block or never end
        raise ReferenceFetchError(f"ref_audio: {path.name} is not a regular file under --allowed-local-media-path")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > rules.max_bytes:
                raise ReferenceFetchError(
                    f"ref_audio: the file is {size} bytes; this server takes at most {rules.max_bytes} "
                    "(--speech-max-body-bytes)"
                )
            data = handle.read(rules.max_bytes + 1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ReferenceFetchError(f"ref_audio: cannot read {path.name} ({reason})") from None
    if not data:
        raise ReferenceFetchError(f"ref_audio: {path.name} is empty")
    return data
