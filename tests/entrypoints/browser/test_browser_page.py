"""The browser page's allow-list: which files of the web folder are served, and a clear error when one is missing;
the headers of its answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.edge.plan.schema import SCHEMA_PATH
from vllm_omni.entrypoints.browser.browser_page import (
    ISOLATION_HEADERS,
    WEB_DIR_ENV,
    BrowserPage,
    BrowserPageError,
    content_type,
    page_headers,
    web_dir,
)

ORT = "node_modules/onnxruntime-web/dist"


def write_web(root: Path) -> Path:
    for name, text in {
        "page/index.html": "<!doctype html>",
        "page/app.mjs": "export {}",
        "page/img/logo.svg": "<svg/>",
        "page/.secret.mjs": "hidden",
        "page/notes.txt": "no content type",
        "edge/parser.mjs": "export {}",
        "edge/test/parser.test.mjs": "test",
        "edge/README.md": "docs",
        f"{ORT}/ort.wasm.min.mjs": "ort",
        f"{ORT}/ort-wasm-simd-threaded.wasm": "\0asm",
        f"{ORT}/ort.wasm.min.mjs.map": "{}",
        f"{ORT}/../package.json": "{}",
        "secret.mjs": "outside",
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "page" / "escape.mjs").symlink_to(root / "secret.mjs")  # a link out of its folder
    return root


def test_each_folder_serves_only_its_own_files_of_known_types(tmp_path):
    page = BrowserPage.find(write_web(tmp_path / "web"))
    assert sorted(page.files) == [
        "app.mjs",
        "edge/parser.mjs",
        "edge/schemas/exec_plan.schema.json",  # the package's own schemas, whatever the web folder
        "edge/schemas/step_contract.schema.json",
        "img/logo.svg",
        "index.html",
        "ort/ort-wasm-simd-threaded.wasm",
        "ort/ort.wasm.min.mjs",
    ]
    assert page.file("") == page.file("index.html") == (tmp_path / "web/page/index.html").resolve()
    for refused in ("../secret.mjs", "edge/../../secret.mjs", "ort/../package.json", "escape.mjs", "/index.html"):
        assert page.file(refused) is None
    assert page.file("edge/schemas/exec_plan.schema.json") == SCHEMA_PATH.resolve()
    types = {name: content_type(path) for name, path in page.files.items()}
    assert types["index.html"].startswith("text/html") and types["edge/parser.mjs"].startswith("text/javascript")
    assert types["ort/ort-wasm-simd-threaded.wasm"] == "application/wasm"


@pytest.mark.parametrize("missing", ["page/index.html", "page", ORT, "node_modules"])
def test_a_missing_folder_says_to_run_setup_web(tmp_path, missing):
    import shutil

    root = write_web(tmp_path / "web")
    target = root / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(BrowserPageError) as error:
        BrowserPage.find(root)
    message = str(error.value)
    assert "\n" not in message and "make setup-web" in message and str(root.resolve()) in message


def test_the_web_folder_is_the_checkouts_unless_overridden(monkeypatch, tmp_path, repo_root):
    monkeypatch.delenv(WEB_DIR_ENV, raising=False)
    assert web_dir() == repo_root / "web"
    monkeypatch.setenv(WEB_DIR_ENV, str(tmp_path))
    assert web_dir() == tmp_path


def test_the_answers_allow_the_pages_own_origin_and_send_no_referrer():
    headers = page_headers("127.0.0.1:8000")
    assert ISOLATION_HEADERS.items() <= headers.items() and headers["Referrer-Policy"] == "no-referrer"
    assert headers["Content-Security-Policy"] == (
        "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
        "connect-src 'self' ws://127.0.0.1:8000 wss://127.0.0.1:8000; style-src 'self'; img-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    for host in ("example.com", "[::1]:8000", "a-b.example:443"):
        assert f"connect-src 'self' ws://{host} wss://{host};" in page_headers(host)["Content-Security-Policy"]
    # A Host header that could change the policy is not named: 'self' alone then.
    for host in ("evil; script-src *", "a b", "x'y", "h,i", "-x", "", None, "[::1", "x:99999999"):
        assert "connect-src 'self'; " in page_headers(host)["Content-Security-Policy"], host


def test_a_key_in_a_query_is_redacted_from_the_access_log():
    import logging

    from vllm_omni.entrypoints.server.server_logs import quiet_known_noise

    quiet_known_noise()
    access = logging.getLogger("uvicorn.access")
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', None, None)
    record.args = ("127.0.0.1:5", "GET", "/edge/browser/?threads=2&api_key=s3cret&x=1", "1.1", 200)
    assert all(f.filter(record) for f in access.filters)
    assert "s3cret" not in record.getMessage() and "api_key=REDACTED&x=1" in record.getMessage()
