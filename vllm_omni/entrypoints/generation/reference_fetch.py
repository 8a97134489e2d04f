"""A client's reference audio fetched from the URL it gave (``ref_audio`` as ``http(s)://`` or ``file://``).

The rules are vLLM's for media inputs, read from the served engine's own settings, with what a speech server
must add because the fetch happens on a client's say-so:

* ``--allowed-media-domains``: when given, only those hosts (vLLM's rule); ``--allowed-local-media-path``: a
  ``file://`` URL must lie under it (symbolic links resolved), and without it ``file://`` is refused (vLLM's rule);
* ``VLLM_AUDIO_FETCH_TIMEOUT`` (seconds, vLLM's) bounds the whole fetch; the bytes are bounded by the server's
  upload limit (``--speech-max-body-bytes``), by ``Content-Length`` and as they arrive;
* no private, loopback, link-local or otherwise non-global address unless its host is one the operator named in
  ``--allowed-media-domains`` (host names compared as the HTTP client reads them: IDNA and Unicode normalised,
  no trailing dot): the peer address of every socket is checked before it connects (:mod:`.egress`), whatever
  spelling of the host the URL used and whichever address a name resolved to;
* redirects (``VLLM_MEDIA_URL_ALLOW_REDIRECTS``, vLLM's, on by default) are followed at most
  :data:`MAX_REDIRECTS` times and only within the same scheme, host and port: a redirect elsewhere is refused.

Every refusal is a :class:`ReferenceFetchError` (a 400 saying which rule and what to do, and never quoting what
was read: the log keeps the detail).
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.model_executor.models.qwen3_tts.prompt_builder import SpeechRequestError

from .egress import CheckedSockets

MAX_REDIRECTS = 3
CHUNK_BYTES = 64 << 10
logger = logging.getLogger("vllm.omni.speech")  # under vLLM's logger: its handlers and level apply


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
            allowed_domains=tuple(getattr(model_config, "allowed_media_domains", None) or ()),
            local_root=Path(root).resolve() if root else None,
            timeout_s=float(envs.VLLM_AUDIO_FETCH_TIMEOUT),
            follow_redirects=bool(envs.VLLM_MEDIA_URL_ALLOW_REDIRECTS),
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_domains", tuple(_domain(name) for name in self.allowed_domains))

    def named(self, host: str) -> bool:
        """Whether ``host`` (as :func:`connected_host` reads it) is one the operator named."""
        return host in self.allowed_domains


def _domain(name: str) -> str:
    """An allowed media domain as :func:`connected_host` reads hosts (IDNA, lower case, no trailing dot)."""
    name = name.strip()
    try:
        return connected_host(f"http://{name}/")
    except ReferenceFetchError:
        return name.rstrip(".").lower()


async def fetch_reference(url: str, rules: MediaRules) -> bytes:
    """The bytes at ``url`` (``http(s)://`` or ``file://``) under ``rules``; :class:`ReferenceFetchError` otherwise.

    A refusal says which rule or what kind of thing was found (not reachable, too large, empty), never a byte of
    what was read, a path on this server, the upstream's status or the connect error: those go to the log."""
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
        logger.info("ref_audio %s: no answer within %g s", _shown(url), rules.timeout_s)
        raise _not_fetched(url) from None


def _shown(url: str) -> str:
    """``url`` without its query and credentials, for messages (a client's own URL, not anything read)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def connected_host(url: str) -> str:
    """The host the HTTP client connects to for ``url``, as it reads it (yarl: IDNA and Unicode normalised, so
    ``１２７.０.０.１`` is ``127.0.0.1``), lower case, without a trailing dot; a :class:`ReferenceFetchError` for a
    URL it cannot read."""
    import yarl

    try:
        host = yarl.URL(url).host
    except (ValueError, UnicodeError):
        host = None
    if not host:
        raise ReferenceFetchError("ref_audio: the URL names no host that can be read (expected http(s)://HOST/...)")
    return host.rstrip(".").lower()


def _check_named(host: str, rules: MediaRules) -> None:
    if rules.allowed_domains and not rules.named(host):
        raise ReferenceFetchError(
            f"ref_audio: {host} is not among the allowed media domains ({', '.join(rules.allowed_domains)}; "
            "--allowed-media-domains)"
        )


def _private(host: str) -> ReferenceFetchError:
    return ReferenceFetchError(
        f"ref_audio: {host} is not a public address; this server fetches reference audio from public addresses "
        "only (no private, loopback or link-local one), unless the host is named in --allowed-media-domains"
    )


def _not_fetched(url: str) -> ReferenceFetchError:
    return ReferenceFetchError(
        f"ref_audio: {_shown(url)} could not be fetched; give a URL that serves the audio file (or send the audio "
        "inline as a data: URL)"
    )


async def _fetch_http(url: str, rules: MediaRules) -> bytes:
    """Each hop through a fresh connector whose sockets are made by :class:`~.egress.CheckedSockets`: the
    peer address of every connection (every hop, every address a name resolves to) is checked before it opens.
    Messages name the client's own ``url``, never a hop's (a ``Location`` is something read)."""
    import aiohttp

    hop = url
    for _hop in range(MAX_REDIRECTS + 1):
        host = connected_host(hop)
        _check_named(host, rules)
        sockets = CheckedSockets(any_address=rules.named(host))
        connector = aiohttp.TCPConnector(socket_factory=sockets, use_dns_cache=False)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, trust_env=False) as session,
                session.get(hop, allow_redirects=False) as response,
            ):
                if response.status in (301, 302, 303, 307, 308):
                    hop = _redirect(url, hop, response.headers.get("Location"), rules)
                    continue
                if response.status != 200:
                    logger.info("ref_audio %s: answered HTTP %d", _shown(hop), response.status)
                    raise _not_fetched(url)
                return await _read_bounded(response, url, rules.max_bytes)
        except (aiohttp.ClientError, OSError) as error:
            if sockets.refused:  # every address the host has is one this server does not connect to
                raise _private(host) from None
            logger.info("ref_audio %s: %s: %s", _shown(hop), type(error).__name__, error)
            raise _not_fetched(url) from None
    raise ReferenceFetchError(f"ref_audio: more than {MAX_REDIRECTS} redirects; give the final URL")


def _redirect(url: str, hop: str, location: str | None, rules: MediaRules) -> str:
    """The next hop after ``hop`` answered a redirect to ``location``; messages name the client's ``url``."""
    if not rules.follow_redirects:
        raise ReferenceFetchError(f"ref_audio: {_shown(url)} redirects, and VLLM_MEDIA_URL_ALLOW_REDIRECTS is off")
    if not location:
        raise _not_fetched(url)
    target = urllib.parse.urljoin(hop, location)
    here = (urllib.parse.urlsplit(hop).scheme.lower(), connected_host(hop), _port(hop))
    try:
        there = (urllib.parse.urlsplit(target).scheme.lower(), connected_host(target), _port(target))
    except (ReferenceFetchError, ValueError):
        there = None
    if here != there:
        raise ReferenceFetchError(
            f"ref_audio: {_shown(url)} redirects to another host; only redirects within the same host are followed: "
            "give the final URL"
        )
    return target


def _port(url: str) -> int | None:
    import yarl

    return yarl.URL(url).port


async def _read_bounded(response: Any, url: str, limit: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > limit:
        raise _too_big(url, limit)
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise _too_big(url, limit)
        chunks.append(chunk)
    if not size:
        raise ReferenceFetchError(f"ref_audio: {_shown(url)} is empty; expected an audio file")
    return b"".join(chunks)


def _too_big(url: str, limit: int) -> ReferenceFetchError:
    return ReferenceFetchError(
        f"ref_audio: {_shown(url)} is larger than the {limit} bytes this server takes (--speech-max-body-bytes)"
    )


def _read_local(parts: urllib.parse.SplitResult, rules: MediaRules) -> bytes:
    """The file a ``file://`` URL names under the allowed root; refusals name neither the root nor the file."""
    if rules.local_root is None:
        raise ReferenceFetchError("ref_audio: file:// URLs need the server started with --allowed-local-media-path")
    if parts.netloc not in ("", "localhost"):
        raise ReferenceFetchError("ref_audio: a file:// URL names no host (file:///PATH)")
    try:  # resolving and stat-ing may fail too (a symlink loop, a directory without search rights): no path shown
        path = Path(urllib.parse.unquote(parts.path)).resolve()
        inside = rules.local_root in path.parents
        regular = inside and path.is_file()
    except (OSError, RuntimeError, ValueError) as error:
        logger.info("ref_audio file not resolved: %s: %s", type(error).__name__, error)
        raise ReferenceFetchError("ref_audio: the file could not be read") from None
    if not inside:
        raise ReferenceFetchError("ref_audio: the file must lie under the server's --allowed-local-media-path")
    if not regular:  # a FIFO or a device would block or never end
        raise ReferenceFetchError("ref_audio: the file:// URL names no regular file under --allowed-local-media-path")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > rules.max_bytes:
                raise ReferenceFetchError(
                    f"ref_audio: the file is larger than the {rules.max_bytes} bytes this server takes "
                    "(--speech-max-body-bytes)"
                )
            data = handle.read(rules.max_bytes + 1)
    except OSError as error:
        logger.info("ref_audio file not read: %s: %s", type(error).__name__, error)
        raise ReferenceFetchError("ref_audio: the file could not be read") from None
    if not data:
        raise ReferenceFetchError("ref_audio: the file is empty; expected an audio file")
    return data
