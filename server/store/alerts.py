"""Reading alerts back, as API models; and the heads an alert fired on, kept as it fires.

An alert over the heads of a layer names, when it fires, the heads that breached
(``Alert.heads``); heads that breach later while it is open are appended to that same
column. So that what it fired on stays known from data (not from its message), the heads
it holds when it is first written are kept in its evidence as ``fired_heads`` (a mapper
event on insert: every writer of alerts, whatever it is, gets it). ``alert_out`` exposes
``fired_layer``/``fired_heads``: that snapshot; for an alert over every head (``over:
max``) the layer and head holding the max (``evidence.at_layer``/``at_head``); for rows
written before the snapshot existed, the ``heads`` column (or ``head``).

The fuses that address the alert's rule (``logitwatch.wire.fuses_for``) are kept the same
way, as ``evidence.fuses``; ``alert_out`` exposes them as ``fuses`` with what the job and
people did with each (``store/fuses.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Run
from logitwatch.server.schemas import AlertOut
from logitwatch.server.store.fuses import alert_fuses
from logitwatch.wire import fuses_for

__all__ = ["alert_out", "alerts_of", "fired_at", "firing_alerts", "list_alerts"]


@event.listens_for(Alert, "before_insert")
def _keep_fired_heads(_mapper: Any, _conn: Any, a: Alert) -> None:
    if a.heads and "fired_heads" not in (a.evidence or {}):
        a.evidence = {**(a.evidence or {}), "fired_heads": sorted(set(a.heads))}
    fuses = fuses_for(a.rule or "")
    if fuses and "fuses" not in (a.evidence or {}):
        a.evidence = {**(a.evidence or {}), "fuses": fuses}


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def fired_at(a: Alert) -> tuple[int | None, list[int] | None]:
    """(layer, heads) the alert fired on, from its stored columns and evidence."""
    ev = a.evidence or {}
    if a.layer is not None:
        snap = ev.get("fired_heads")
        if isinstance(snap, list) and snap and all(_int(h) is not None for h in snap):
            return a.layer, sorted(set(snap))
        if a.heads:
            return a.layer, sorted(set(a.heads))
        return a.layer, [a.head] if a.head is not None else None
    layer, head = _int(ev.get("at_layer")), _int(ev.get("at_head"))
    if layer is not None and head is not None:
        return layer, [head]
    return None, None


def alert_out(a: Alert, run: Run) -> AlertOut:
    fired_layer, fired_heads = fired_at(a)
    return AlertOut(
        id=a.id, run_id=a.run_id, run=run.name, project=run.project, rule=a.rule,
        metric=a.metric, severity=a.severity, state=a.state, rank=a.rank, layer=a.layer,
        head=a.head, started_step=a.started_step, fired_step=a.fired_step,
        fired_at=a.fired_at, paged_step=a.paged_step, resolved_step=a.resolved_step, value=a.value,
        baseline=a.baseline, threshold=a.threshold, message=a.message,
        evidence=dict(a.evidence), remedies=list(a.remedies),
        heads=list(a.heads) if a.heads else None, suppressed=a.suppressed,
        acked_at=a.acked_at, acked_by=a.acked_by, fired_layer=fired_layer,
        fired_heads=fired_heads, fuses=alert_fuses(a, run),
    )


def list_alerts(session: Session, run_id: int, *, after_id: int = 0) -> list[AlertOut]:
    rows = session.execute(
        select(Alert, Run)
        .join(Run, Run.id == Alert.run_id)
        .where(Alert.run_id == run_id, Alert.id > after_id)
        .order_by(Alert.id)
    ).all()
    return [alert_out(a, r) for a, r in rows]


def alerts_of(session: Session, run_ids: Iterable[int]) -> dict[int, list[AlertOut]]:
    """Every alert of each of ``run_ids``, oldest first (:func:`list_alerts` of each), in
    one query: what a page of runs shows (the alerts inbox)."""
    ids = list(run_ids)
    out: dict[int, list[AlertOut]] = {i: [] for i in ids}
    if not ids:
        return out
    rows = session.execute(
        select(Alert, Run)
        .join(Run, Run.id == Alert.run_id)
        .where(Alert.run_id.in_(ids))
        .order_by(Alert.id)
    ).all()
    for a, r in rows:
        out[a.run_id].append(alert_out(a, r))
    return out


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
