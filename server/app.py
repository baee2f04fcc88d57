"""The collector application factory: ``create_app(settings)``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import sessionmaker
from starlette.exceptions import HTTPException as StarletteHTTPException

from logitwatch.server.alerts.config import configured_rules, start_background
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.api.routes import (
    alerts,
    dashboard,
    figures,
    fuses,
    ingest,
    pages,
    runs,
    session,
    stream,
)
from logitwatch.server.api.routes.pages import WEB
from logitwatch.server.auth import Authenticator, bind_refusal
from logitwatch.server.db.partitions import (
    PartitionWorker,
    ensure_partitions,
    is_lock_error,
    is_partitioned,
)
from logitwatch.server.db.session import make_engine, migrate, write_lock
from logitwatch.server.errors import ApiError
from logitwatch.server.guards import CsrfCheck, FrameHeaders, HostCheck
from logitwatch.server.limits import BodyLimit
from logitwatch.server.notify import WebhookNotifier
from logitwatch.server.settings import Settings
from logitwatch.server.store.parse import MAX_ERRORS
from logitwatch.server.store.retention import RetentionWorker

__all__ = ["create_app"]

log = logging.getLogger("logitwatch.server")

HTTP_CODES = {404: "not-found", 405: "method-not-allowed", 400: "bad-request"}


def _writes(request: Request) -> bool:
    """Whether ``request`` could have stored something (its errors then say nothing was)."""
    return request.method not in ("GET", "HEAD", "OPTIONS")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build a collector. The database is migrated to head when the app starts."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.db_url, pool_size=settings.pool_size,
                             max_overflow=settings.pool_max_overflow,
                             pool_timeout=settings.pool_timeout)
        migrate(engine)
        app.state.db = engine
        app.state.write_lock = write_lock(engine)
        app.state.sessions = sessionmaker(engine, expire_on_commit=False)
        app.state.auth = Authenticator(app.state.sessions, settings)
        refusal = bind_refusal(settings, app.state.auth.tokens())
        if refusal is not None:
            engine.dispose()
            raise RuntimeError(refusal)
        app.state.notifier = (
            WebhookNotifier(settings.webhook_url, timeout=settings.webhook_timeout,
                            retries=settings.webhook_retries, sessions=app.state.sessions,
                            info=settings.webhook_info)
            if settings.webhook_url else None
        )
        # PostgreSQL: the day partitions of frames and points, made ahead of time. A lock not
        # had (another collector's ingest or partition change) never fails the start: the
        # PartitionWorker makes what is missing on its next pass.
        try:
            ensure_partitions(engine)
        except Exception as e:
            if not is_lock_error(e):
                raise
            log.warning("partitions not made ahead at start (the worker retries): %s",
                        str(e).splitlines()[0])
        partitions = PartitionWorker(engine).start() if is_partitioned(engine) else None
        days, drop_days = settings.retention_days, settings.retention_drop_days
        retention = (
            RetentionWorker(app.state.sessions, older_than=days * 86400 if days else None,
                            bucket_steps=settings.retention_bucket_steps,
                            interval=settings.retention_interval,
                            drop_older_than=drop_days * 86400 if drop_days else None).start()
            if days or drop_days else None
        )
        stop_alerts = start_background(app)
        try:
            yield
        finally:
            stop_alerts()
            if retention is not None:
                retention.stop()
            if partitions is not None:
                partitions.stop()
            if app.state.notifier is not None:
                app.state.notifier.close()
            engine.dispose()

    app = FastAPI(
        title="logitwatch collector",
        version="0.1.0",
        description="Stores training-health frames, fires early-warning alerts, serves the "
        "dashboard.",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc load their scripts from a CDN: a page of this origin
        # running third-party code, and nothing offline. /docs is a local page instead.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.alert_engine = AlertEngine(configured_rules(settings),
                                         max_ranks=settings.alert_state_max_ranks,
                                         idle_seconds=settings.alert_state_idle_seconds)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = dict(exc.headers)
        if exc.status == 503:
            headers.setdefault("Retry-After", "5")
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and pages.wants_page(request):
            return pages.not_found_page()  # a person's browser: a page that helps
        # Unknown paths, wrong methods: the same {"code", "message"} shape as the rest.
        code = HTTP_CODES.get(exc.status_code, f"http-{exc.status_code}")
        message = str(exc.detail)
        if exc.status_code == 400:  # FastAPI's "There was an error parsing the body"
            message = f"body: {message}" + (" (nothing was stored)" if _writes(request) else "")
        return JSONResponse({"code": code, "message": message},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The first few errors and a count: an answer never grows with the input.
        errors = [
            {"field": ".".join(str(p) for p in e["loc"])[:300], "message": e["msg"][:1000]}
            for e in exc.errors()[:MAX_ERRORS]
        ]
        count = max(getattr(exc, "count", 0), len(exc.errors()))
        first = errors[0] if errors else {"field": "?", "message": "invalid"}
        more = f"{count} errors in all, the first {len(errors)} listed" \
            if count > len(errors) else ""
        # a read stores nothing anyway: saying so is for the requests that write
        said = "; ".join(x for x in ("nothing was stored" if _writes(request) else "", more)
                         if x)
        return JSONResponse(
            {"code": "invalid-request",
             "message": f"{first['field']}: {first['message']}" + (f" ({said})" if said else ""),
             "errors": errors, "error_count": count},
            status_code=422,
        )

    for r in (ingest.router, runs.router, stream.router, figures.router, session.router,
              alerts.router, fuses.router):
        app.include_router(r, prefix="/api/v1")
    app.include_router(pages.router)
    app.include_router(dashboard.router)  # /api/v1/dashboard, worst heads, compare (+ page)
    app.mount("/static", StaticFiles(directory=WEB), name="static")
    # Pages, scripts and figures compressed (not the event stream: Starlette skips it).
    app.add_middleware(GZipMiddleware, minimum_size=1000, compresslevel=6)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes,
                       body_timeout=settings.body_timeout)
    app.add_middleware(CsrfCheck, settings=settings)
    app.add_middleware(HostCheck, settings=settings)
    app.add_middleware(FrameHeaders)
    app.add_middleware(InternalErrors)
    return app


class InternalErrors:
    """ASGI middleware: an unexpected exception becomes a logged JSON 500
    ``{"code": "internal-error", ...}`` instead of escaping to the server, which answers
    plain text and then closes the connection (a client's next request on it fails with a
    reset instead of an answer)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            body = json.dumps({"code": "internal-error", "message": "the collector failed on "
                               "this request (see its log); nothing was stored"}).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
