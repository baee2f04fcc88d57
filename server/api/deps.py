"""FastAPI dependencies as Annotated aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.auth import Principal
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import BadRequest, Conflict, NotFound, Unauthorized
from logitwatch.server.settings import Settings

__all__ = [
    "run_visible_to",
    "resolve_run",
    "COOKIE",
    "ProjectQuery",
    "RunRef",
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


#: A run in a path: its id (digits only), or its name. A value of digits only is always an
#: id; a run whose name is digits only is reached by its id (``GET /runs?name=`` finds it).
RunRef = Annotated[str, Path(
    min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$",
    description="The run: its id, or its name (with `project` when several projects have a "
    "run of that name). Digits only are always an id.",
)]
#: The project of a run named in the path (``?project=``).
ProjectQuery = Annotated[str | None, Query(
    max_length=128, description="The run's project, when the path names a run by name "
    "(needed only when several projects have a run of that name).",
)]


def resolve_run(session: Session, principal: Principal, ref: str,
                project: str | None = None) -> int:
    """The id of the run ``ref`` names: an id (digits only, see :data:`RunRef`), or a name
    within ``project``, once ``principal`` may see it. Another project's run answers the
    404 of a missing one; a name that several visible projects use answers 409
    ``run-ambiguous``. An id is not looked up in open mode: the route's own query answers
    404 for a missing run, after checking its parameters."""
    if principal.project is not None:
        if project is not None and project != principal.project:
            raise NotFound("run-not-found", f"no run {ref!r} in project {project!r}")
        project = principal.project
    if ref.isdigit():
        run_id = int(ref)
        if run_id > INT32_MAX:
            raise BadRequest("invalid-request",
                             f"run_id: the id {ref} is past the largest run id ({INT32_MAX})",
                             field="run_id")
        if project is not None:
            have = session.scalar(select(Run.project).where(Run.id == run_id))
            if have != project:
                raise NotFound("run-not-found", f"no run with id {run_id}")
        return run_id
    q = select(Run.id, Run.project).where(Run.name == ref)
    if project is not None:
        q = q.where(Run.project == project)
    rows = session.execute(q.limit(11)).all()
    if not rows:
        where = f" in project {project!r}" if project is not None else ""
        raise NotFound("run-not-found", f"no run named {ref!r}{where}")
    if len(rows) > 1:
        projects = ", ".join(sorted(str(r.project) for r in rows[:10]))
        raise Conflict("run-ambiguous",
                       f"{'more than 10' if len(rows) > 10 else len(rows)} runs are named "
                       f"{ref!r} (projects {projects}): add ?project= or use the run id")
    return int(rows[0].id)


def visible_run(
    run_id: RunRef,
    principal: ReadDep,
    request: Request,
    project: ProjectQuery = None,
) -> int:
    """The id of the run the path names (id or name), once the caller may read it. Another
    project's run answers the same 404 as a missing one, so ids do not reveal what other
    projects hold."""
    with session_scope(request.app.state.sessions) as s:
        return resolve_run(s, principal, run_id, project)


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
