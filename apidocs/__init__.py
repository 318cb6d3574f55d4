"""Offline API docs for every LedgerMQ HTTP server: `/docs` (Swagger UI) and `/redoc` (ReDoc)
served from assets installed with the pinned `fastapi-offline` package, never from a CDN.

FastAPI's own docs pages load Swagger UI and ReDoc from jsDelivr and the favicon and fonts from
other hosts, so on a machine without internet they are blank. The broker, the name server and the
broker container build their app with `docs_url=None, redoc_url=None` and call
`install_offline_docs(app)`. This module imports nothing of LedgerMQ, so any server (and the
console) can use it without depending on another."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
ASSETS_URL = "/docs-assets"

# name → media type of each file the pages load; the package pins their versions.
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
# The assets change only with the pinned package: let a browser keep them for a day.
_ASSET_MAX_AGE_S = 86_400

# Every path these pages use; servers with access control leave them open (docs are public).
DOC_PATHS = frozenset(
    {DOCS_URL, REDOC_URL, OAUTH2_REDIRECT_URL} | {f"{ASSETS_URL}/{name}" for name in _ASSETS}
)

# ReDoc 2.5 draws its "API docs by Redocly" logo from cdn.redoc.ly, unconditionally: the file is
# served with that address replaced by an empty inline image.
_ASSET_PATCHES = {
    "redoc.standalone.js": [
        (
            b"https://cdn.redoc.ly/redoc/logo-mini.svg",
            b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E",
        )
    ]
}
# And the pages may load only what this server serves, should another such address remain.
# Inline script and styles: FastAPI's pages start the UIs inline; ReDoc's search runs in a blob:
# worker.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)

# Swagger UI's defaults would ask validator.swagger.io to check the spec and render a badge.
_SWAGGER_PARAMETERS = {"validatorUrl": None}


def assets_dir() -> Path:
    """Directory holding the vendored Swagger UI and ReDoc files (inside `fastapi_offline`)."""
    return Path(str(resources.files("fastapi_offline") / "static"))


def install_offline_docs(app: FastAPI) -> None:
    """Add `/docs`, `/redoc`, the OAuth2 redirect page and the assets to `app`, which must have
    been built with `docs_url=None, redoc_url=None` (else FastAPI's CDN pages hold those paths)."""
    if app.docs_url or app.redoc_url:
        raise ValueError("build the app with docs_url=None, redoc_url=None before installing offline docs")
    folder = assets_dir()
    missing = [name for name in _ASSETS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"offline docs assets missing from {folder}: {', '.join(missing)}")
    openapi_url = app.openapi_url or "/openapi.json"

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        base = root(request)
        return _offline(
            get_swagger_ui_html(
                openapi_url=base + openapi_url,
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=base + OAUTH2_REDIRECT_URL,
                swagger_js_url=f"{base}{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{base}{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{base}{ASSETS_URL}/favicon.png",
                swagger_ui_parameters=_SWAGGER_PARAMETERS,
            )
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return _offline(get_swagger_ui_oauth2_redirect_html())

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        base = root(request)
        return _offline(
            get_redoc_html(
                openapi_url=base + openapi_url,
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{base}{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{base}{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )

    for name, media_type in _ASSETS.items():
        app.add_api_route(
            f"{ASSETS_URL}/{name}",
            _asset_endpoint(folder / name, media_type),
            methods=["GET"],
            include_in_schema=False,
        )


def _offline(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


@functools.cache
def _asset_bytes(path: Path) -> bytes:
    """An asset's bytes, with the CDN addresses the pinned files still hold replaced (read once
    per process, shared by every app of it)."""
    data = path.read_bytes()
    for old, new in _ASSET_PATCHES.get(path.name, ()):
        data = data.replace(old, new)
    return data


def _asset_endpoint(path: Path, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def asset() -> Response:
        return Response(
            _asset_bytes(path),
            media_type=media_type,
            headers={"Cache-Control": f"public, max-age={_ASSET_MAX_AGE_S}"},
        )

    asset.__name__ = f"docs_asset_{path.stem.replace('.', '_').replace('-', '_')}"
    return asset
