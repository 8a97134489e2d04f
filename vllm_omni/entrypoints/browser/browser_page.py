"""The ``browser`` hardware class's page, served by ``vllm serve --omni --edge-hardware browser``.

Public routes (outside ``/v1``: no API key; the page sends the key it is given with its own API calls):

* ``/edge/browser/`` -> ``web/page/index.html``; ``/edge/browser/NAME`` -> ``web/page/NAME``;
* ``/edge/browser/edge/NAME.mjs`` -> ``web/edge/NAME.mjs`` (the decoder's modules);
* ``/edge/browser/edge/schemas/NAME.json`` -> the package's ``vllm_omni/edge/plan/schemas/NAME.json`` (the plan and
  step-contract schemas the modules import: the very files the server checks plans with, so the two readers
  cannot drift; in the checkout ``web/edge/schemas`` is a link to that folder, for Node);
* ``/edge/browser/ort/NAME`` -> ``web/node_modules/onnxruntime-web/dist/NAME`` (the WASM runtime, installed by
  ``make setup-web``; served here, never from a CDN).

Every answer (the files, the redirect, a 404) carries the cross-origin-isolation headers WASM threads need
(COOP ``same-origin``, COEP ``require-corp``), CORP ``same-origin``, ``Referrer-Policy: no-referrer`` and a
``Content-Security-Policy`` that allows the page's own origin only (:func:`content_security_policy`). The
page's ``/v1`` calls (plans, artifacts, voices, the WebSocket) are same-origin, which COEP never blocks: those
routes need no extra header.

The API key never travels in a URL: the page reads it from the address's fragment (``#api_key=KEY``, which
no request carries) or its key field, and ignores ``?api_key=``; the redirect ``/edge/browser`` ->
``/edge/browser/`` drops any query (a fragment stays with the browser, which keeps it across the redirect).

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
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.edge.plan.schema import SCHEMA_DIR

from ..plans.edge_plans import EdgeServingError

WEB_DIR_ENV = "VLLM_OMNI_WEB_DIR"
ROUTE = "/edge/browser"
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# The page's own origin only. script-src: its modules, and 'wasm-unsafe-eval' for onnxruntime-web to compile its
# WASM (in the decoder worker: a worker runs under the policy of its own script's response, which is this one);
# worker-src: the decoder worker and onnxruntime-web's pthread workers, all same-origin module scripts (its blob:
# path is only taken for a cross-origin script); connect-src: fetch and the WebSocket (CSP 3's 'self' matches
# ws:/wss: of the page's host; :func:`content_security_policy` names them too, for browsers that do not);
# style-src: page.css (no inline style); frame-ancestors 'none': no other site frames the key field.
CSP_DIRECTIVES = (
    "default-src 'self'",
    "script-src 'self' 'wasm-unsafe-eval'",
    "worker-src 'self'",
    "connect-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
)
# A Host header fit to name in the policy (a name or IPv4 address, or a bracketed IPv6 one, and a port).
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
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
    """Files of ``directory`` (relative to the web folder, or an absolute path: the package's schemas) served under
    ``ROUTE/url_prefix``: those with a suffix in ``suffixes``, in subfolders too when ``recursive``."""

    url_prefix: str
    directory: str | Path
    suffixes: tuple[str, ...]
    recursive: bool = False
    required: str = ""  # a file that must be there (relative to the folder)


PAGE_FOLDERS = (
    PageFolder("", "page", tuple(CONTENT_TYPES), recursive=True, required="index.html"),
    PageFolder("edge/", "edge", (".mjs",)),
    PageFolder("edge/schemas/", SCHEMA_DIR, (".json",), required="exec_plan.schema.json"),
    PageFolder("ort/", "node_modules/onnxruntime-web/dist", (".mjs", ".js", ".wasm"), required="ort.wasm.min.mjs"),
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


def content_security_policy(host: str | None = None) -> str:
    """:data:`CSP_DIRECTIVES`; with ``host`` (the request's Host header, when it is a plain host[:port]) its
    ``ws://`` and ``wss://`` origins are named in connect-src as well, for browsers whose 'self' does not match a
    WebSocket of the page's host."""
    directives = list(CSP_DIRECTIVES)
    if host and _HOST.fullmatch(host):
        directives = [f"{d} ws://{host} wss://{host}" if d.startswith("connect-src ") else d for d in directives]
    return "; ".join(directives)


def page_headers(host: str | None = None) -> dict[str, str]:
    """The headers of every answer of the page's routes: :data:`ISOLATION_HEADERS`, no referrer, the CSP."""
    return {
        **ISOLATION_HEADERS,
        "Referrer-Policy": "no-referrer",
        "Content-Security-Policy": content_security_policy(host),
        "X-Content-Type-Options": "nosniff",
    }


def build_page_router(page: BrowserPage):
    """The page's routes: ``ROUTE`` redirects to ``ROUTE/`` (the page's relative URLs need the slash; the query
    is dropped, so a key put there by mistake is not sent again), then the allow-listed files, GET and HEAD; every
    answer with :func:`page_headers`; anything else is a 404."""
    from fastapi import APIRouter, Request
    from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse

    router = APIRouter()

    async def to_folder(request: Request):
        return RedirectResponse(f"{ROUTE}/", status_code=308, headers=page_headers(request.headers.get("host")))

    async def asset(request: Request, path: str):
        headers = {**page_headers(request.headers.get("host")), "Cache-Control": "no-cache"}
        file = page.file(path)
        if file is None:
            return PlainTextResponse(f"{ROUTE}/{path} is not a file of the browser page", 404, headers=headers)
        return FileResponse(file, media_type=content_type(file), headers=headers)

    router.add_api_route(ROUTE, to_folder, methods=["GET", "HEAD"], include_in_schema=False)
    router.add_api_route(ROUTE + "/{path:path}", asset, methods=["GET", "HEAD"], include_in_schema=False)
    return router
