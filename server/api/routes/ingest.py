"""POST /api/v1/ingest: frames in; the answer carries the run's firing alerts back."""

from __future__ import annotations

from fastapi import APIRouter, Request

from logitwatch.server.db.models import Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.schemas import AlertOut, IngestIn, IngestOut
from logitwatch.server.store.alerts import alert_out, firing_alerts
from logitwatch.server.store.ingest import ingest_frames

router = APIRouter(tags=["ingest"])


@router.post("/ingest", response_model=IngestOut)
def ingest(body: IngestIn, request: Request) -> IngestOut:
    """Store a batch of frames, all or nothing. Frames already stored (same run, rank and
    seq) are skipped and counted as duplicates, so a client may resend a batch safely.

    The transaction commits *before* the answer is sent: a 200 means stored.
    """
    state = request.app.state
    changed: list[AlertOut] = []
    with session_scope(state.sessions) as session:
        result = ingest_frames(session, body.frames)
        for a in state.alert_engine.process(session, result.new_frames):
            run = session.get(Run, a.run_id)
            assert run is not None
            changed.append(alert_out(a, run))
        firing = firing_alerts(session, result.run_ids)
    if state.notifier is not None:
        for a in changed:
            state.notifier.notify(a)
    return IngestOut(
        accepted=result.accepted, duplicates=result.duplicates, alerts=firing, control={}
    )
