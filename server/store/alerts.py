"""Reading alerts back, as API models."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Run
from logitwatch.server.schemas import AlertOut

__all__ = ["alert_out", "firing_alerts", "list_alerts"]


def alert_out(a: Alert, run: Run) -> AlertOut:
    return AlertOut(
        id=a.id, run_id=a.run_id, run=run.name, project=run.project, rule=a.rule,
        metric=a.metric, severity=a.severity, state=a.state, rank=a.rank, layer=a.layer,
        head=a.head, started_step=a.started_step, fired_step=a.fired_step,
        fired_at=a.fired_at, paged_step=a.paged_step, resolved_step=a.resolved_step, value=a.value,
        baseline=a.baseline, threshold=a.threshold, message=a.message,
        evidence=dict(a.evidence), remedies=list(a.remedies),
        heads=list(a.heads) if a.heads else None, suppressed=a.suppressed,
        acked_at=a.acked_at, acked_by=a.acked_by,
    )


def list_alerts(session: Session, run_id: int, *, after_id: int = 0) -> list[AlertOut]:
    rows = session.execute(
        select(Alert, Run)
        .join(Run, Run.id == Alert.run_id)
        .where(Alert.run_id == run_id, Alert.id > after_id)
        .order_by(Alert.id)
    ).all()
    return [alert_out(a, r) for a, r in rows]


def firing_alerts(session: Session, run_ids: Iterable[int]) -> list[AlertOut]:
    ids = list(run_ids)
    if not ids:
        return []
    rows = session.execute(
        select(Alert, Run)
        .join(Run, Run.id == Alert.run_id)
        .where(Alert.run_id.in_(ids), Alert.state == "firing", Alert.suppressed.is_(None))
        .order_by(Alert.id)
    ).all()
    return [alert_out(a, r) for a, r in rows]
