"""Changing a run: its configuration, its tags; deleting it with everything stored of it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Frame, Metric, Point, RuleMemory, Run, RunTag
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import DeletedOut
from logitwatch.server.store.runs import _tags, get_run

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_KEYS",
    "TAG_RE",
    "delete_run",
    "set_config",
    "set_tags",
]

#: A tag: 1-64 characters of [A-Za-z0-9._:-].
TAG_RE = re.compile(r"[A-Za-z0-9._:\-]{1,64}")

#: Bounds of a run's configuration (``set_config``): its JSON text, its keys, its nesting.
MAX_CONFIG_BYTES = 16_384
MAX_CONFIG_KEYS = 256
MAX_CONFIG_DEPTH = 32


def _depth(v: Any, limit: int) -> int:
    """How deep ``v`` nests (a scalar 0), counted no further than past ``limit``."""
    if limit < 0 or not isinstance(v, (dict, list)):
        return 0
    items = v.values() if isinstance(v, dict) else v
    return 1 + max((_depth(x, limit - 1) for x in items), default=0)


def set_config(session: Session, run_id: int, config: dict[str, Any]) -> dict[str, Any]:
    """Set a run's configuration (a JSON object, replacing the previous one); return it.
    Raises :class:`BadRequest` ``bad-config`` for text that is not UTF-8 (a lone
    surrogate escape), nesting deeper than ``MAX_CONFIG_DEPTH``, or a non-finite number
    (``ValueError``, which the route names)."""
    get_run(session, run_id)
    if _depth(config, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        raise BadRequest("bad-config", f"config: nested deeper than {MAX_CONFIG_DEPTH} levels",
                         field="config")
    text = json.dumps(config, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("bad-config", "config: a key or value holds a lone surrogate "
                         "(\\ud800-\\udfff not in a pair), which is not text",
                         field="config") from None
    if size > MAX_CONFIG_BYTES or len(config) > MAX_CONFIG_KEYS:
        raise BadRequest("config-too-large", f"config: at most {MAX_CONFIG_KEYS} keys and "
                         f"{MAX_CONFIG_BYTES} bytes of JSON", field="config")
    run = session.get(Run, run_id)
    assert run is not None
    run.config = config
    session.flush()
    return config


def set_tags(session: Session, run_id: int, *, add: Sequence[str] = (),
             remove: Sequence[str] = ()) -> list[str]:
    """Add and remove labels of a run; return its tags."""
    get_run(session, run_id)
    for t in add:
        if not TAG_RE.fullmatch(t):
            raise BadRequest("bad-tag", f"tag {t!r}: 1-64 characters of [A-Za-z0-9._:-]")
    have = set(_tags(session, [run_id]).get(run_id, []))
    for t in sorted(set(add) - have):
        session.add(RunTag(run_id=run_id, tag=t))
    if remove:
        session.execute(
            delete(RunTag).where(RunTag.run_id == run_id, RunTag.tag.in_(list(remove)))
        )
    session.flush()
    return _tags(session, [run_id]).get(run_id, [])


def delete_run(session: Session, run_id: int) -> DeletedOut:
    """Delete a run with its frames, values, metrics, tags and alerts (one transaction)."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    metric_ids = select(Metric.id).where(Metric.run_id == run_id).scalar_subquery()
    out = DeletedOut(
        run_id=run_id, name=run.name, project=run.project,
        frames=session.scalar(select(func.count()).where(Frame.run_id == run_id)) or 0,
        points=session.scalar(select(func.count()).where(Point.metric_id.in_(metric_ids)))
        or 0,
    )
    # Children first, explicitly: no reliance on ON DELETE CASCADE being enforced. A point
    # is one of a metric of its frame's run (ingest takes both from the run it stores), so
    # the run's points are those of its metrics: none is left to look up by frame, which
    # on a partitioned PostgreSQL probes every partition per frame.
    session.execute(delete(Point).where(Point.metric_id.in_(metric_ids)))
    for table in (Frame, Metric, RunTag, Alert, RuleMemory):
        session.execute(delete(table).where(table.run_id == run_id))  # type: ignore[attr-defined]
    session.execute(delete(Run).where(Run.id == run_id))
    return out
