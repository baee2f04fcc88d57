"""The alerts inbox: the runs with alerts, each with its verdict and its incidents; the runs
with a firing incident first, then by their latest alert.

The runs are chosen, ordered and cut in SQL, and each chunk of them is read with one query
for their rows and one for their alerts (not one run at a time). ``state`` keeps the runs
with an incident in that state: ``firing`` is exact in SQL (an incident fires while one of
its alerts does); for ``resolved`` SQL keeps the runs that may have one
(:func:`_may_have_resolved`) and the incidents themselves (:func:`.incidents.incidents`)
decide, a chunk at a time, until the page is full.
"""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Run
from logitwatch.server.schemas import AlertOut, RunOut
from logitwatch.server.store import incidents as inc
from logitwatch.server.store import runs
from logitwatch.server.store.alerts import alerts_of

__all__ = ["InboxRunOut", "alerts_inbox"]


class InboxRunOut(BaseModel):
    run: RunOut
    verdict: inc.VerdictOut
    incidents: list[inc.IncidentOut]
    alerts: list[AlertOut]


def _may_have_resolved() -> ColumnElement[bool]:
    """SQL, over a run's alerts grouped: the run may have a resolved incident. Its incidents
    are its alerts in (fired_step, id) order, cut where an alert fires after every earlier
    one of the incident resolved; a firing alert (and every alert after it) belongs to the
    last one. So a resolved incident is made of alerts not firing, fired no later than its
    first firing alert, if it has one. Necessary, not sufficient: the incidents decide."""
    calm = func.min(case((Alert.state != "firing", Alert.fired_step)))
    first_firing = func.min(case((Alert.state == "firing", Alert.fired_step)))
    return and_(calm.is_not(None), or_(first_firing.is_(None), calm <= first_firing))


def alerts_inbox(session: Session, *, project: str | None = None, state: str | None = None,
                 limit: int = 100, active_seconds: float = 600.0) -> list[InboxRunOut]:
    """Every run with alerts (of ``project``, if given), its verdict and its incidents (only
    those in ``state``, ``firing`` or ``resolved``, if given; a run with none is left out);
    runs with a firing incident first, then by their latest alert; at most ``limit``."""
    # Ordered and cut in SQL: firing runs first, then by their latest alert, so that many
    # runs with newer resolved alerts cannot push a run still firing out of the first page.
    firing = func.max(case((Alert.state == "firing", 1), else_=0))
    q = select(Alert.run_id).group_by(Alert.run_id)
    if project is not None:
        q = q.join(Run, Run.id == Alert.run_id).where(Run.project == project)
    if state == "firing":
        q = q.having(firing == 1)
    elif state == "resolved":
        q = q.having(_may_have_resolved())
    q = q.order_by(firing.desc(), func.max(Alert.id).desc())
    out: list[InboxRunOut] = []
    result = session.execute(q.execution_options(yield_per=limit))
    try:
        for part in result.partitions():
            ids = [row[0] for row in part]
            alerts = alerts_of(session, ids)
            for r in runs.read_runs(session, ids, active_seconds=active_seconds):
                run, mine = r.out, alerts[r.out.id]
                found = [i for i in inc.incidents(mine, run.diverged_step)
                         if state is None or i.state == state]
                if not found:
                    continue
                out.append(InboxRunOut(run=run, incidents=found, alerts=mine,
                                       verdict=inc.verdict(run, mine, last_loss=r.last_loss)))
                if len(out) >= limit:
                    return out
    finally:
        result.close()
    return out
