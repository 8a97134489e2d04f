"""The ``browser`` hardware class's page, served by ``vllm serve --omni --edge-hardware browser``.

Public routes (outside ``/v1``: no API key; the page sends the key it is given with its own API calls):

* ``/edge/browser/`` -> ``web/page/index.html``; ``/edge/browser/NAME`` -> ``web/page/NAME``;
* ``/edge/browser/edge/NAME.mjs`` -> ``web/edge/NAME.mjs`` (the decoder's modules);
* ``/edge/browser/ort/NAME`` -> ``web/node_modules/onnxruntime-web/dist/NAME`` (the WASM runtime, installed by
  ``make setup-web``; served here, never from a CDN).

Every answer carries the cross-origin-isolation headers WASM threads need (COOP ``same-origin``, COEP
``require-corp``) and CORP ``same-origin``. The page's ``/v1`` calls (plans, artifacts, voices, the
WebSocket) are same-origin, which COEP never blocks: those routes need no extra header.

Where the files are: the page is not package data. It lives in the repository checkout's ``web/`` folder,
beside the ``vllm_omni`` package (the serving venv installs the package editable, so ``vllm_omni/..`` is
the checkout); ``VLLM_OMNI_WEB_DIR`` names another folder of the same layout (a deployment that copied
``web/`` with its ``node_modules``).

Nothing from a request reaches the filesystem: each folder is listed once at start (files with a known
content type, resolved and checked to lie inside their folder) and a request path is only a key of that
allow-list.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' parameter types (Request), imported
# inside build_page_router, from the live annotations.
import os
from dataclasses import dataclass
from pathlib import Path

from .edge_plans import EdgeServingError

WEB_DIR_ENV = "VLLM_OMNI_WEB_DIR"
ROUTE = "/edge/browser"
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".wasm": "application/wasm",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
SETUP_HINT = "run `make setup-web` in the repository checkout (npm ci --prefix web), or set VLLM_OMNI_WEB_DIR"


class BrowserPageError(EdgeServingError):
    """The browser page's files are missing; the message says which and what to run."""


@dataclass(frozen=True)
class PageFolder:
    """Files of ``directory`` (relative to the web folder) served under ``ROUTE/url_prefix``: those with a
    suffix in ``suffixes``, in subfolders too when ``recursive``."""

    url_prefix: str
    directory: str
    suffixes: tuple[str, ...]
    recursive: bool = False
    required: str = ""  # a file that must be there (relative to the folder)


PAGE_FOLDERS = (
    PageFolder("", "page", tuple(CONTENT_TYPES), recursive=True, required="index.html"),
    PageFolder("edge/", "edge", (".mjs",)),
    PageFolder("ort/", "node_modules/onnxruntime-web/dist", (".mjs", ".js", ".wasm"), required="ort.min.mjs"),
)


def web_dir() -> Path:
    """The web folder: ``$VLLM_OMNI_WEB_DIR``, else ``web/`` of the checkout holding the ``vllm_omni`` package."""
    override = os.environ.get(WEB_DIR_ENV)
    if override:
        return Path(override)
    import vllm_omni

    return Path(vllm_omni.__file__).resolve().parent.parent / "web"


def _listed(root: Path, folder: PageFolder) -> dict[str, Path]:
    directory = (root / folder.directory).resolve()
    if not directory.is_dir() or (folder.required and not (directory / folder.required).is_file()):
        missing = directory / folder.required if directory.is_dir() else directory
        raise BrowserPageError(f"the browser page needs {missing}, which is missing: {SETUP_HINT}")
    found = {}
    for path in directory.rglob("*") if folder.recursive else directory.iterdir():
        relative = path.relative_to(directory)
        if path.suffix not in folder.suffixes or any(part.startswith(".") for part in relative.parts):
            continue
        resolved = path.resolve()
        if resolved.is_file() and resolved.is_relative_to(directory):  # a link out of the folder is not served
            found[folder.url_prefix + relative.as_posix()] = resolved
    return found


@dataclass(frozen=True)
class BrowserPage:
    """The page's allow-list: URL path under ``ROUTE/`` -> file."""

    files: dict[str, Path]

    @classmethod
    def find(cls, root: Path | None = None) -> "BrowserPage":
        """List the page's folders under ``root`` (:func:`web_dir` by default); :class:`BrowserPageError` names
        the first missing one."""
        root = web_dir() if root is None else root
        files: dict[str, Path] = {}
        for folder in PAGE_FOLDERS:
            files |= _listed(root, folder)
        return cls(files)

    def file(self, url_path: str) -> Path | None:
        """The file served at ``ROUTE/url_path`` (``""`` is the index), or None."""
        return self.files.get(url_path or "index.html")


def content_type(path: Path) -> str:
    return CONTENT_TYPES[path.suffix]


def build_page_router(page: BrowserPage):
    """The page's routes: ``ROUTE`` redirects to ``ROUTE/`` (the page's relative URLs need the slash), then
    the allow-listed files, GET and HEAD, each with :data:`ISOLATION_HEADERS`; anything else is a 404."""
    from fastapi import APIRouter, Request
    from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse

    router = APIRouter()
    headers = {**ISOLATION_HEADERS, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

    async def to_folder(request: Request):
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{ROUTE}/{query}", status_code=308, headers=ISOLATION_HEADERS)

    async def asset(path: str):
        file = page.file(path)
        if file is None:
            return PlainTextResponse(f"{ROUTE}/{path} is not a file of the browser page", 404, headers=headers)
        return FileResponse(file, media_type=content_type(file), headers=headers)

    router.add_api_route(ROUTE, to_folder, methods=["GET", "HEAD"], include_in_schema=False)
    router.add_api_route(ROUTE + "/{path:path}", asset, methods=["GET", "HEAD"], include_in_schema=False)
    return router
