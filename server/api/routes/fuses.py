"""A run's fuses (docs/FUSES.md): ``GET /runs/{run}/fuses`` what the collector knows of
them; ``POST /runs/{run}/fuses`` applies or undoes one, handed to the job by the next
ingest answer's ``control.fuses``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from logitwatch.server.api.deps import RunIdDep, SessionDep, client_address, credentials
from logitwatch.server.api.routes.runs import writable_run
from logitwatch.server.db.models import Run
from logitwatch.server.errors import NotFound
from logitwatch.server.store import fuses as store

router = APIRouter(tags=["fuses"])


class FuseIn(BaseModel):
    fuse: str = Field(max_length=64, description="the fuse: `qk_clip`, `lr_backoff`, `rollback`, "
                      "`qk_norm`, `soft_cap`")
    action: Literal["apply", "undo"]
    alert_id: int | None = Field(None, ge=1, description="the alert it answers (shown there)")


@router.get("/runs/{run_id}/fuses")
def get_fuses(run_id: RunIdDep, session: SessionDep) -> dict[str, Any]:
    """``{"fuses": {name: "apply"|"undo"}, "job": {name: state}, "log": [...]}``."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    return store.run_fuses(run)


@router.post(
    "/runs/{run_id}/fuses",
    responses={404: {"description": "no such run (`run-not-found`)"},
               422: {"description": "an unknown fuse, or an alert of another run"}},
)
def post_fuse(
    run_id: Annotated[int, Depends(writable_run)],
    body: FuseIn,
    request: Request,
    session: SessionDep,
) -> dict[str, Any]:
    """Apply or undo a fuse of the run: its job acts at the end of the step after its next
    ingest answer (which carries ``control.fuses``). Needs an ``ingest`` token of the run's
    project (or open mode). Every action is kept in the run's log, shown in the alert it
    answers, and the job's ``fuse.*`` series chart what it did."""
    principal = request.app.state.auth.authorize(credentials(request), scope="ingest",
                                                 client=client_address(request))
    by = principal.name or ("open" if principal.open else f"token {principal.token_id}")
    return store.set_fuse(session, run_id, body.fuse, body.action, by=by,
                          alert_id=body.alert_id)
