"""The alert engine: runs the rules over newly stored frames and persists alerts.

Rule state lives in memory per (run, rank, layer, head). When the engine meets a
(run, rank) for the first time (a fresh process, or after a collector restart) it rebuilds
that state by replaying the stored history, so a restart resumes where it stopped.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import defaultdict

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.alerts.rules import REMEDIES, HeadState, LogitRisingRule, State, Transition
from logitwatch.server.db.models import Alert, Frame, Metric, Point, Run
from logitwatch.server.store.ingest import NewFrame

__all__ = ["AlertEngine"]

log = logging.getLogger("logitwatch.alerts")

Key = tuple[int, int, int, int]  # run_id, rank, layer, head


class AlertEngine:
    """Evaluates the rules for every new frame, inside the ingest transaction."""

    def __init__(self, rule: LogitRisingRule | None = None) -> None:
        self.rule = rule or LogitRisingRule()
        self._heads: dict[Key, HeadState] = {}
        self._loaded: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def process(self, session: Session, frames: list[NewFrame]) -> list[Alert]:
        """Advance the rules over ``frames`` (in step order); return alerts created or changed."""
        changed: list[Alert] = []
        with self._lock:
            for f in sorted(frames, key=lambda f: (f.run_id, f.rank, f.step)):
                matrix = f.heads.get(self.rule.metric)
                if matrix is None:
                    continue
                if (f.run_id, f.rank) not in self._loaded:
                    self._restore(session, f.run_id, f.rank, before_step=f.step)
                for layer, row in enumerate(matrix):
                    for head, value in enumerate(row):
                        key = (f.run_id, f.rank, layer, head)
                        st = self._heads.setdefault(key, HeadState())
                        t = self.rule.evaluate(st, f.step, value)
                        if t is not None:
                            changed.append(self._persist(session, key, t, f.time))
        return changed

    def _restore(self, session: Session, run_id: int, rank: int, before_step: int) -> None:
        """Replay stored history (silently) to rebuild rule state for one (run, rank)."""
        self._loaded.add((run_id, rank))
        m = session.scalar(
            select(Metric).where(Metric.run_id == run_id, Metric.name == self.rule.metric)
        )
        if m is None or not m.layers:
            return
        rows = session.execute(
            select(Frame.step, Point.data)
            .join(Frame, Frame.id == Point.frame_id)
            .where(Point.metric_id == m.id, Frame.rank == rank, Frame.step < before_step)
            .order_by(Frame.step.desc())
            .limit(self.rule.window + self.rule.lag + self.rule.for_samples)
        ).all()
        open_alerts = {
            (a.layer, a.head): a
            for a in session.scalars(
                select(Alert).where(
                    Alert.run_id == run_id, Alert.rank == rank, Alert.rule == self.rule.name,
                    Alert.state == State.FIRING.value,
                )
            )
        }
        for step, data in reversed(rows):
            mat = np.frombuffer(data, dtype="<f4").reshape(m.layers, m.heads)
            for layer in range(m.layers):
                for head in range(m.heads):
                    st = self._heads.setdefault((run_id, rank, layer, head), HeadState())
                    self.rule.evaluate(st, step, float(mat[layer, head]))
        for (layer, head), a in open_alerts.items():
            if layer is None or head is None:
                continue
            st = self._heads.setdefault((run_id, rank, layer, head), HeadState())
            st.state, st.started_step = State.FIRING, a.started_step

    def _persist(self, session: Session, key: Key, t: Transition, when: float) -> Alert:
        run_id, rank, layer, head = key
        if t.state is State.RESOLVED:
            alert = session.scalar(
                select(Alert).where(
                    Alert.run_id == run_id, Alert.rank == rank, Alert.layer == layer,
                    Alert.head == head, Alert.rule == self.rule.name,
                    Alert.state == State.FIRING.value,
                )
            )
            if alert is not None:
                alert.state = State.RESOLVED.value
                alert.resolved_step = t.step
                return alert
        run = session.get(Run, run_id)
        name = run.name if run else str(run_id)
        fin = t.value if math.isfinite(t.value) else None
        rel = (
            f"{t.value / t.baseline:.1f}x its baseline {t.baseline:.3g}"
            if t.baseline and fin is not None
            else "non-finite" if fin is None else f"above {t.limit:.3g}"
        )
        msg = (
            f"{name}: rank {rank}, layer {layer}, head {head}: max attention logit "
            f"{t.value:.4g} is {rel} since step {t.started_step} (fired at step {t.step}). "
            "Attention logits climbing precede softmax saturation and loss divergence."
        )
        alert = Alert(
            run_id=run_id, rule=self.rule.name, metric=self.rule.metric, severity="warning",
            state=State.FIRING.value, rank=rank, layer=layer, head=head,
            started_step=t.started_step, fired_step=t.step, fired_at=when,
            value=fin, baseline=t.baseline, threshold=t.limit, message=msg,
            evidence={"value": str(t.value), "baseline": t.baseline, "limit": t.limit,
                      "factor": self.rule.factor, "for_samples": self.rule.for_samples},
            remedies=list(REMEDIES),
        )
        session.add(alert)
        session.flush()
        log.warning("ALERT %s", msg)
        return alert


def group_by_run(alerts: list[Alert]) -> dict[int, list[Alert]]:
    out: dict[int, list[Alert]] = defaultdict(list)
    for a in alerts:
        out[a.run_id].append(a)
    return out
