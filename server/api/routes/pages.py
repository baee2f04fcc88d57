"""The dashboard's pages and assets, all served by the collector (works offline)."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

router = APIRouter(include_in_schema=False)

WEB = Path(str(files("logitwatch.web")))


@lru_cache(maxsize=1)
def _plotly_js() -> bytes:
    # plotly.js ships inside the installed `plotly` package: never a CDN.
    return (files("plotly") / "package_data" / "plotly.min.js").read_bytes()


@router.get("/static/plotly.min.js")
def plotly_js() -> Response:
    return Response(_plotly_js(), media_type="text/javascript",
                    headers={"Cache-Control": "public, max-age=86400"})


@router.get("/")
def index() -> FileResponse:
    return FileResponse(WEB / "index.html")


@router.get("/docs")
def api_docs() -> FileResponse:
    """The API, listed from /openapi.json by a page of the collector (no CDN)."""
    return FileResponse(WEB / "docs.html")


@router.get("/runs/{run_id}")
def run_page(run_id: int) -> FileResponse:
    return FileResponse(WEB / "run.html")
