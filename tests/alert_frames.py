"""Frames a job would send, replayed through the real ingest and engine (SQLite), for the
alert-policy tests: ``frames_at`` builds them from per-step functions, ``alerts_of`` replays
them, ``feed`` sends them one by one through a collector's write path into a given database
(an engine per call: a restarted collector), ``defaults_with`` takes a change back to show
a test fails without it; ``frame``, ``logits`` and ``alerts`` build frames by sample index
and read back the stored alerts for the engine tests."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.replay import replay
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.db.models import Alert
from logitwatch.server.db.session import session_scope
from logitwatch.server.schemas import AlertOut, IngestIn
from logitwatch.server.store.ingest import ingest_frames

#: float16's largest finite value (what an fp16 attention can hold)
FP16 = 65504.0


def frames_at(interval: int, steps: int, scalars: Any, heads: Any = None,
              run: str = "r", history: bool = False) -> list[dict[str, Any]]:
    """Frames a job sampling every ``interval`` steps sends: step 0, interval, ...;
    ``scalars(step)`` and ``heads(step)`` give each frame's values. With ``history`` each
    frame also carries the scalars of every step since the previous frame, as the hooks
    send them (``logitwatch.wire``)."""
    out = []
    for i, step in enumerate(range(0, steps, interval)):
        f = {"run": run, "rank": 0, "seq": i + 1, "step": step, "time": 1000.0 + step,
             "scalars": scalars(step), "heads": heads(step) if heads else {}}
        between = list(range(max(0, step - interval + 1), step))
        if history and between:
            rows = [scalars(s) for s in between]
            f["history"] = {"steps": between,
                            "scalars": {k: [r.get(k) for r in rows] for k in rows[0]}}
        out.append(f)
    return out


def alerts_of(frames: list[dict[str, Any]], rules: Any = None) -> list[AlertOut]:
    return replay(frames, rules=rules).alerts


def feed(sessions: sessionmaker[Session], engine: AlertEngine,
         frames: list[dict[str, Any]]) -> list[Alert]:
    """Ingest ``frames`` one by one into the database of ``sessions`` and let ``engine``
    judge each, as the collector's write path does; the alerts each changed."""
    out: list[Alert] = []
    for f in frames:
        with session_scope(sessions) as s:
            # received when it was stamped: the collector's clock agrees with the job's
            stored = ingest_frames(s, IngestIn.model_validate({"frames": [f]}).frames,
                                   now=f["time"])
            out.extend(engine.process(s, stored.new_frames))
    return out


def by_rule(alerts: list[AlertOut], name: str) -> list[AlertOut]:
    return [a for a in alerts if a.rule == name]


def defaults_with(name: str, params: dict[str, Any] | None = None,
                   page: dict[str, Any] | None = None,
                   rules: Sequence[RuleSpec] = DEFAULT_RULES) -> list[RuleSpec]:
    """``rules`` (the defaults), rule ``name``'s params updated by ``params`` and its page's
    fields by ``page``: a change taken back, to show the test fails without it."""
    return [dataclasses.replace(r, params={**r.params, **(params or {})},
                                page=dataclasses.replace(r.page, **page) if page else r.page)
            if r.name == name else r for r in rules]


def with_damage() -> list[RuleSpec]:
    """The default rules with round ten's damage test paging again (``aftershock_above: 12``
    on ``loss_jump`` and ``grad_blowup``; dropped from the defaults in round twenty-one): the
    Page option is the user's to set."""
    damage = {"aftershock_above": 12.0}
    return defaults_with("grad_blowup", page=damage,
                          rules=defaults_with("loss_jump", page=damage))


def plateau_loss(step: int) -> float:
    return 3.0 + 0.05 * math.sin(step * 1.7)  # batch noise around a plateau


def growing(start: int, rate: float = 0.02, base: float = 5.0):  # type: ignore[no-untyped-def]
    """2 layers x 4 heads; layer 1 head 2 grows exponentially from ``start``."""
    def heads(step: int) -> dict[str, Any]:
        m = [[base + 0.1 * ((h + step // 10) % 3) for h in range(4)] for _ in range(2)]
        if step >= start:
            m[1][2] = base * math.exp(rate * (step - start))
        return {"attn.logit_max": m}
    return heads


# -- frames by sample index, and what the database holds (the engine tests) ----------------


def frame(i: int, *, run: str = "r1", heads: Any = None, **scalars: Any) -> dict[str, Any]:
    """Frame ``i`` of rank 0 of ``run``: step ``10 i``, these scalars and per-head matrices."""
    return {"run": run, "rank": 0, "seq": i, "step": i * 10, "time": 1000.0 + i,
            "scalars": scalars, "heads": heads or {}}


def logits(i: int, rising: tuple[tuple[int, int], ...] = (), start: int = 20) -> dict[str, Any]:
    """2 layers x 4 heads of max logits near 5; the ``rising`` cells double each sample
    from sample ``start``."""
    m = [[5.0 + 0.1 * ((i + h) % 3) for h in range(4)] for _ in range(2)]
    for layer, head in rising:
        if i >= start:
            m[layer][head] = 5.0 * 2 ** (i - start + 1)
    return {"attn.logit_max": m}


def alerts(sessions: sessionmaker[Session]) -> list[Alert]:
    """Every alert stored in the database, oldest first."""
    with sessions() as s:
        return list(s.scalars(select(Alert).order_by(Alert.id)).all())
