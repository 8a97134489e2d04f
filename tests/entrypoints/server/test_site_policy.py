"""The server's site policy: the names it answers to (DNS rebinding) and the origins that may change its state."""

from __future__ import annotations

import pytest

from vllm_omni.entrypoints.server.site_policy import Origin, SitePolicy, parse_origin


def test_origins_are_parsed_not_compared_as_strings():
    assert parse_origin("HTTP://LocalHost:8000/") == Origin("http", "localhost", 8000)
    assert parse_origin("https://[::1]") == Origin("https", "::1", 443)
    for bad in ("https://http://localhost:8000", "null", "file:///etc", "http://user@host", "http://h/path", "h:80"):
        with pytest.raises(ValueError, match="not a web origin"):
            parse_origin(bad)


def test_settings_refuse_null_and_malformed_entries():
    with pytest.raises(ValueError, match="'null' is the origin of every sandboxed frame"):
        SitePolicy.from_settings("https://app.example, null", None)
    with pytest.raises(ValueError, match="allowed-origins\\): 'app.example' is not a web origin"):
        SitePolicy.from_settings("app.example", None)
    with pytest.raises(ValueError, match="--speech-allowed-hosts: 'http://x' is not a host name"):
        SitePolicy.from_settings(None, "http://x")


def test_only_the_servers_own_names_are_answered():
    policy = SitePolicy.from_settings("https://app.example", "tts.internal", "tts-box")
    for host in (
        "127.0.0.1:8000",
        "[::1]:8000",
        "localhost:8000",
        "a.localhost",
        "tts.internal:80",
        "tts-box:8000",
        "app.example",
        None,
    ):
        assert policy.host_allowed(host), host
    for host in ("rebind.example:8000", "127.0.0.1.rebind.example", "", "localhost.evil.com:8000", "a b"):
        assert not policy.host_allowed(host), host
    assert SitePolicy.from_settings(None, "*").host_allowed("anything.example")
    dotted = SitePolicy.from_settings("http://tts.example.:8000", None)  # a fully qualified name, either way
    assert dotted.host_allowed("tts.example:8000") and dotted.origin_allowed("http://tts.example:8000", "127.0.0.1")


def test_state_changes_come_from_the_servers_own_origin_or_an_allowed_one():
    policy = SitePolicy.from_settings("https://app.example", None)
    assert policy.origin_allowed(None, "localhost:8000")
    assert policy.origin_allowed("http://localhost:8000", "localhost:8000")
    assert policy.origin_allowed("https://tts.example", "tts.example")  # behind a TLS proxy
    assert policy.origin_allowed("https://app.example", "127.0.0.1:8000")
    for origin in ("http://localhost:9000", "https://http://localhost:8000", "null", "http://evil.example"):
        assert not policy.origin_allowed(origin, "localhost:8000"), origin
