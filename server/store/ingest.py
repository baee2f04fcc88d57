"""The write path: frames in, deduplicated on (run, rank, seq), stored in one transaction."""

from __future__ import annotations

import time as _time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.errors import BadRequest
from logitwatch.server.schemas import FrameIn
from logitwatch.server.store.codec import encode

__all__ = ["IngestResult", "NewFrame", "ingest_frames"]


@dataclass(slots=True)
class NewFrame:
    """A frame that was stored by this call (duplicates are not), for the alert engine."""

    run_id: int
    rank: int
    step: int
    time: float
    scalars: dict[str, float]
    heads: dict[str, list[list[float]]]


@dataclass(slots=True)
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    run_ids: set[int] = field(default_factory=set)
    new_frames: list[NewFrame] = field(default_factory=list)


def _run_id(session: Session, project: str, name: str) -> int:
    rid = session.scalar(select(Run.id).where(Run.project == project, Run.name == name))
    if rid is not None:
        return rid
    # Another collector may create the same run concurrently: the unique constraint turns
    # that into an IntegrityError, answered 409, and the client's retry then finds the run.
    return session.execute(
        insert(Run)
        .values(project=project, name=name, created_at=_time.time())
        .returning(Run.id)
    ).scalar_one()


def _metric_ids(
    session: Session, run_id: int, shapes: dict[str, tuple[int, int]], limit: int | None
) -> dict[str, int]:
    rows = session.execute(
        select(Metric.name, Metric.id, Metric.layers, Metric.heads).where(
            Metric.run_id == run_id, Metric.name.in_(list(shapes))
        )
    ).all()
    ids = {r.name: r.id for r in rows}
    for r in rows:
        if (r.layers, r.heads) != shapes[r.name]:
            raise BadRequest(
                "shape-mismatch",
                f"metric {r.name!r} of this run has shape {r.layers}x{r.heads}, "
                f"this batch sends {shapes[r.name][0]}x{shapes[r.name][1]}",
            )
    new = [name for name in shapes if name not in ids]
    if limit is not None and new:
        have = session.scalar(select(func.count()).where(Metric.run_id == run_id)) or 0
        if have + len(new) > limit:
            raise BadRequest(
                "too-many-metrics",
                f"frames: this batch would give the run {have + len(new)} metric names "
                f"({have} stored, {len(new)} new, e.g. {new[0]!r}); at most {limit} per run "
                "(max_metrics_per_run). Nothing was stored.",
                field="frames",
            )
    for name, (layers, heads) in shapes.items():
        if name not in ids:
            ids[name] = session.execute(
                insert(Metric)
                .values(run_id=run_id, name=name, layers=layers, heads=heads)
                .returning(Metric.id)
            ).scalar_one()
    return ids


def ingest_frames(
    session: Session, frames: list[FrameIn], *, max_metrics_per_run: int | None = None
) -> IngestResult:
    """Store ``frames``; frames already stored (same run, rank and seq) are counted, skipped.

    A batch that would give a run more than ``max_metrics_per_run`` metric names raises
    :class:`BadRequest` (``too-many-metrics``); the caller's transaction then stores nothing.
    """
    result = IngestResult()
    by_run: dict[tuple[str, str], list[FrameIn]] = defaultdict(list)
    for f in frames:
        by_run[(f.project, f.run)].append(f)
    for (project, name), group in by_run.items():
        run_id = _run_id(session, project, name)
        result.run_ids.add(run_id)
        seqs = {(f.rank, f.seq) for f in group}
        existing = set(
            session.execute(
                select(Frame.rank, Frame.seq).where(
                    Frame.run_id == run_id, Frame.seq.in_([s for _, s in seqs])
                )
            )
        )
        fresh: list[FrameIn] = []
        seen: set[tuple[int, int]] = set()
        for f in group:
            key = (f.rank, f.seq)
            if key in existing or key in seen:
                result.duplicates += 1
                continue
            seen.add(key)
            fresh.append(f)
        if not fresh:
            continue
        shapes: dict[str, tuple[int, int]] = {}
        for f in fresh:
            for k in f.scalars:
                shapes[k] = (0, 0)
            for k, m in f.heads.items():
                shapes[k] = (len(m), len(m[0]))
        metric_ids = _metric_ids(session, run_id, shapes, max_metrics_per_run)
        frame_ids = session.execute(
            insert(Frame).returning(Frame.id, sort_by_parameter_order=True),
            [
                {"run_id": run_id, "rank": f.rank, "seq": f.seq, "step": f.step, "time": f.time}
                for f in fresh
            ],
        ).scalars().all()
        points = []
        for fid, f in zip(frame_ids, fresh, strict=True):
            for k, v in f.scalars.items():
                points.append({"metric_id": metric_ids[k], "frame_id": fid, "data": encode([v])})
            for k, m in f.heads.items():
                points.append({"metric_id": metric_ids[k], "frame_id": fid, "data": encode(m)})
            result.new_frames.append(
                NewFrame(run_id, f.rank, f.step, f.time, dict(f.scalars), f.heads)
            )
        if points:
            session.execute(insert(Point), points)
        last = max(fresh, key=lambda f: (f.step, f.time))
        run = session.get(Run, run_id)
        assert run is not None
        if run.last_step is None or last.step >= run.last_step:
            session.execute(
                update(Run).where(Run.id == run_id).values(last_step=last.step, last_time=last.time)
            )
        result.accepted += len(fresh)
    return result
