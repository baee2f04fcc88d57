"""POST /api/v1/ingest: frames in; the answer carries the run's firing alerts back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from logitwatch.server.api.deps import IngestDep
from logitwatch.server.auth import Principal
from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import Forbidden
from logitwatch.server.limits import check_batch
from logitwatch.server.schemas import AlertOut, IngestIn, IngestOut
from logitwatch.server.store import lifecycle
from logitwatch.server.store.alerts import alert_out, firing_alerts
from logitwatch.server.store.detail import detail_ranks
from logitwatch.server.store.fuses import answer_control, note_job_states
from logitwatch.server.store.parse import ingest_openapi_body, parse_ingest
from logitwatch.wire import CONTROL_DETAIL_RANKS, CONTROL_FUSES

router = APIRouter(tags=["ingest"])


async def _raw_body(request: Request) -> bytes:
    """The request body as bytes (read in the event loop; parsed in the worker thread)."""
    return await request.body()


@router.post(
    "/ingest",
    response_model=IngestOut,
    responses={
        401: {"description": "no or an unknown token (`auth-required`, `invalid-token`)"},
        403: {"description": "a read token, or a frame of another project"},
        413: {"description": "body over max_request_bytes (`request-too-large`)"},
        422: {"description": "bad input; the message names the field; nothing stored"},
        429: {"description": "the token's rate is spent (`rate-limited`, Retry-After)"},
        503: {"description": "the database is unavailable or every connection is busy "
              "(`db-unavailable`, `db-busy`, Retry-After); nothing stored, resend"},
    },
    openapi_extra={"requestBody": ingest_openapi_body()},
)
def ingest(
    request: Request, principal: IngestDep, raw: Annotated[bytes, Depends(_raw_body)]
) -> IngestOut:
    """Store a batch of frames, all or nothing. Frames already stored (same run, rank and
    seq) are skipped and counted as duplicates, so a client may resend a batch safely.

    With an ingest token, a frame that names no ``project`` belongs to the token's project,
    and a frame of any other project refuses the whole batch (403 ``project-forbidden``).

    An end frame (``"end": "finished"``) says the job ended: rank 0's finishes the run
    (``status`` ``finished``, its open ``no_data`` alert resolves); a later frame of rank 0
    makes it ``running`` again.

    The transaction commits *before* the answer is sent: a 200 means stored. While a run
    of the batch has a firing alert, ``control`` asks the job to sample every
    ``alert_sample_every`` steps (``{"sample_every": N}``); otherwise it is ``{}``. For a
    job that reduces its ranks before sending, ``control["detail_ranks"]`` names the ranks
    that held the alerting heads' max (``store/detail.py``): they send their own frames.
    The body may be gzip-compressed (``Content-Encoding: gzip``).
    """
    state = request.app.state
    # Parsed here rather than by FastAPI: a validated fast path (store/parse.py), with the
    # pydantic model's own 422 for anything it is not sure of.
    body = parse_ingest(raw, request.headers.get("content-type"))
    check_batch(body, state.settings)
    _own_project(body, principal)
    changed: list[AlertOut] = []
    with state.write_lock, session_scope(state.sessions) as session:  # SQLite: in turn
        result, finished = lifecycle.ingest(
            session, body.frames, max_metrics_per_run=state.settings.max_metrics_per_run)
        alerts = state.alert_engine.process(session, result.new_frames)
        if finished:  # their open no_data alerts resolve
            alerts += state.alert_engine.check_stale(session, runs=finished)
        for a in alerts:
            run = session.get(Run, a.run_id)
            assert run is not None
            changed.append(alert_out(a, run))
        note_job_states(session, result.new_frames)  # before the alerts read them
        firing = firing_alerts(session, result.run_ids)
        fuses = answer_control(session, result.run_ids)
    if state.notifier is not None:
        for a in changed:
            state.notifier.notify(a)
    every = state.settings.alert_sample_every
    control: dict[str, object] = {"sample_every": every} if firing and every else {}
    ranks = detail_ranks(body.frames, firing) if firing else []
    if ranks:  # a job that reduces its ranks: the alerting heads' ranks send their own
        control[CONTROL_DETAIL_RANKS] = ranks
    if fuses:  # what people asked of the run's fuses (store/fuses.py)
        control[CONTROL_FUSES] = fuses
    return IngestOut(
        accepted=result.accepted, duplicates=result.duplicates, alerts=firing, control=control
    )


def _own_project(body: IngestIn, principal: Principal) -> None:
    """Every frame must belong to the token's project (open mode: any project)."""
    if principal.project is None:
        return
    for i, f in enumerate(body.frames):
        if "project" not in f.model_fields_set:
            f.project = principal.project
        elif f.project != principal.project:
            raise Forbidden(
                "project-forbidden",
                f"frames.{i}.project: this token writes to project {principal.project!r} "
                f"only, not {f.project!r}; nothing was stored",
                field=f"frames.{i}.project",
            )
