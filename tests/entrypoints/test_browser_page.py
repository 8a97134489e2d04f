"""The browser page's allow-list: which files of the web folder are served, and a clear error when one is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.entrypoints.browser_page import WEB_DIR_ENV, BrowserPage, BrowserPageError, content_type, web_dir

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
        f"{ORT}/ort.min.mjs": "ort",
        f"{ORT}/ort-wasm-simd-threaded.jsep.wasm": "\0asm",
        f"{ORT}/ort.min.mjs.map": "{}",
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
        "img/logo.svg",
        "index.html",
        "ort/ort-wasm-simd-threaded.jsep.wasm",
        "ort/ort.min.mjs",
    ]
    assert page.file("") == page.file("index.html") == (tmp_path / "web/page/index.html").resolve()
    for refused in ("../secret.mjs", "edge/../../secret.mjs", "ort/../package.json", "escape.mjs", "/index.html"):
        assert page.file(refused) is None
    types = {name: content_type(path) for name, path in page.files.items()}
    assert types["index.html"].startswith("text/html") and types["edge/parser.mjs"].startswith("text/javascript")
    assert types["ort/ort-wasm-simd-threaded.jsep.wasm"] == "application/wasm"


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
