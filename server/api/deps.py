"""FastAPI dependencies as Annotated aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.auth import Principal
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import NotFound, Unauthorized
from logitwatch.server.settings import Settings

__all__ = [
    "run_visible_to",
    "COOKIE",
    "AnyPrincipalDep",
    "IngestDep",
    "ReadDep",
    "RunIdDep",
    "SessionDep",
    "SettingsDep",
    "WriteDep",
    "credentials",
    "get_session",
]

#: The dashboard's session cookie: a read token, HttpOnly and SameSite=Strict.
COOKIE = "logitwatch_token"
INT32_MAX = 2**31 - 1


def get_session(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.sessions) as s:
        yield s


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def credentials(request: Request) -> str | None:
    """The token of a request: ``Authorization: Bearer <token>``, else the session cookie."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized("bad-authorization",
                               "Authorization: expected 'Bearer <token>'")
        return value.strip()
    return request.cookies.get(COOKIE) or None


def client_address(request: Request) -> str | None:
    """The caller's address (behind a trusted proxy: the forwarded one, uvicorn's)."""
    return request.client.host if request.client is not None else None


def read_principal(request: Request) -> Principal:
    p: Principal = request.app.state.auth.authorize(credentials(request), scope="read",
                                                    client=client_address(request))
    return p


def ingest_principal(request: Request) -> Principal:
    p: Principal = request.app.state.auth.authorize(credentials(request), scope="ingest",
                                                    client=client_address(request))
    return p


def any_principal(request: Request) -> Principal:
    p: Principal = request.app.state.auth.authorize(credentials(request), scope=None,
                                                    client=client_address(request))
    return p


ReadDep = Annotated[Principal, Depends(read_principal)]
IngestDep = Annotated[Principal, Depends(ingest_principal)]
#: Changing a project's state (acknowledging, silencing, deleting): its ingest token, the
#: one that writes, or open mode; a read token only reads.
WriteDep = IngestDep
AnyPrincipalDep = Annotated[Principal, Depends(any_principal)]


def visible_run(
    run_id: Annotated[int, Path(ge=1, le=INT32_MAX, description="run id")],
    principal: ReadDep,
    request: Request,
) -> int:
    """The path's run id, once the caller may read it. Another project's run answers the
    same 404 as a missing one, so ids do not reveal what other projects hold."""
    return run_visible_to(principal, run_id, request)


def run_visible_to(principal: Principal, run_id: int, request: Request) -> int:
    """``run_id`` if ``principal`` may see that run, else the 404 of a missing run."""
    if principal.project is not None:
        with session_scope(request.app.state.sessions) as s:
            project = s.scalar(select(Run.project).where(Run.id == run_id))
        if project is None or not principal.sees(project):
            raise NotFound("run-not-found", f"no run with id {run_id}")
    return run_id


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
RunIdDep = Annotated[int, Depends(visible_run)]
