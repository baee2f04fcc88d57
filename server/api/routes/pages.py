"""The dashboard's pages and assets, all served by the collector (works offline)."""

from __future__ import annotations

import gzip
import re
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

router = APIRouter(include_in_schema=False)

WEB = Path(str(files("logitwatch.web")))


@lru_cache(maxsize=1)
def _plotly_js() -> bytes:
    # plotly.js ships inside the installed `plotly` package: never a CDN.
    return (files("plotly") / "package_data" / "plotly.min.js").read_bytes()


@lru_cache(maxsize=1)
def _plotly_js_gzip() -> bytes:
    # Compressed once (4.8 MB -> ~1.4 MB), not at every request.
    return gzip.compress(_plotly_js(), compresslevel=9, mtime=0)


@router.get("/static/plotly.min.js")
def plotly_js(request: Request) -> Response:
    headers = {"Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(_plotly_js_gzip(), media_type="text/javascript",
                        headers={**headers, "Content-Encoding": "gzip"})
    return Response(_plotly_js(), media_type="text/javascript", headers=headers)


def wants_page(request: Request) -> bool:
    """A browser asking for a page (not the API, not a script)."""
    path = request.url.path
    return (not path.startswith(("/api/", "/static/"))
            and "text/html" in request.headers.get("accept", ""))


def not_found_page() -> FileResponse:
    return FileResponse(WEB / "404.html", status_code=404)


_RUN_REF = re.compile(r"[A-Za-z0-9._:-]+")  # as the API's run references (deps.RunRef)


@router.get("/")
def index() -> FileResponse:
    return FileResponse(WEB / "index.html")


@router.get("/docs")
def api_docs() -> FileResponse:
    """The API, listed from /openapi.json by a page of the collector (no CDN)."""
    return FileResponse(WEB / "docs.html")


@router.get("/runs/{run_id}")
def run_page(run_id: str) -> FileResponse:
    """The run page, for a run id or name (the page asks the API, which resolves either);
    what cannot name a run gets the 404 page, not a JSON validation error."""
    if not _RUN_REF.fullmatch(run_id) or len(run_id) > 128:
        return not_found_page()
    return FileResponse(WEB / "run.html")
