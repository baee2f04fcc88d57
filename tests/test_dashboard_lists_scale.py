"""The dashboard's runs list and alerts inbox answer as they did before migration 0016 and do
work in proportion to the page: on a varied store (finished, stopped, diverged, NaN and inf
last losses, empty runs, restarts, late batches, history steps; tags, configurations,
projects; firing, resolved and overlapping alerts), on SQLite and PostgreSQL.

The answers before 0016 come from ``bench/lists_baseline.py`` (the old query shapes: every
run listed and filtered in Python, a sparkline per run for the status filter, the inbox
walked a run at a time, ``max(frames.id)`` per run)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, text, update
from sqlalchemy.orm import Session

from bench.lists_baseline import (
    OldSparklineCache,
    old_alerts_inbox,
    old_get_run,
    old_last_loss,
    old_list_runs,
    old_runs_overview,
)
from logitwatch.server.api.routes.dashboard import run_page_data
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.db.session import alembic_config, make_engine, migrate
from logitwatch.server.schemas import FrameIn
from logitwatch.server.settings import Settings
from logitwatch.server.store import incidents as inc
from logitwatch.server.store.alerts import list_alerts
from logitwatch.server.store.inbox import alerts_inbox
from logitwatch.server.store.lifecycle import ingest
from logitwatch.server.store.queries import get_run, list_runs, set_config, set_tags
from logitwatch.server.store.runs_view import STATUSES, SparklineCache, runs_overview

NOW = time.time() - 10_000  # the collector's clock at ingest: every run idle, stably
T0 = 1_700_000_000.0
DAY = 86400.0
CONFIGS: list[dict[str, Any] | None] = [
    {"lr": 0.1, "data": "wikipédia", "Model": {"Layers": 12}},
    {"note": "\u0130stanbul", "unit": "\u212aelvin"},  # lower() of both holds ASCII
    {},
    {"lr": 1e-05, "opt": "AdamW", "list": [1, "Two"]},
    None,
]
NEEDLES = ["run-00", "RUN-BIG", "wiki", "WIKIPÉDIA", "pédia", "tag-a", "exp:1", '"lr":0.1',
           "lr", "p2 ", "proj-3 tag", "i\u0307stanbul", "istanbul", "kelvin", "e-05", "layers",
           "é", " ", "-", "zzz", "{"]


def _frame(run: str, project: str, seq: int, step: int, t: float, *, rank: int = 0,
           loss: float | None = None, history: dict[str, Any] | None = None,
           end: bool = False) -> FrameIn:
    scalars = {} if end else {"grad.norm": 1.0 + step % 3}
    if loss is not None:
        scalars["loss"] = loss
    return FrameIn(run=run, project=project, rank=rank, seq=seq, step=step, time=t,
                   scalars=scalars, history=history, end="finished" if end else None)


def _alert(run_id: int, rule: str, state: str, fired: int, *, resolved: int | None = None,
           severity: str = "warning", suppressed: str | None = None) -> Alert:
    return Alert(run_id=run_id, rule=rule, metric="loss" if "loss" in rule else "grad.norm",
                 severity=severity, state=state, rank=0, started_step=fired, fired_step=fired,
                 fired_at=T0 + fired, resolved_step=resolved, message=rule, evidence={},
                 remedies=[], suppressed=suppressed,
                 paged_step=fired if severity != "info" else None)


def seed(session: Session, start: int, n: int, *, plain: bool = False) -> None:
    """``n`` runs from number ``start``, of every kind (``plain``: running, firing alerts
    only, no tag or configuration: runs that the filters the tests ask for leave out)."""
    for i in range(start, start + n):
        kind = 0 if plain else i % 10
        name = f"Run-Big-{i:03d}" if i % 6 == 0 else f"run-{i:03d}"
        project = "p1" if plain else ["p1", "p2", "Proj-3"][i % 3]
        t = T0 + (i % 7) * 50  # runs whose last frames share a time: ordered by id
        losses = [3.0 - 0.1 * s for s in range(6)]
        if kind == 3 or kind == 4:
            losses[-1] = math.nan
        if kind == 5:
            losses[-1] = math.inf
        frames = [] if kind == 6 else [_frame(name, project, s, s, t + s, loss=v)
                                       for s, v in enumerate(losses)]
        if kind == 7:  # restarted from step 2 (seqs go on), a rank 1 NaN, a frame sans loss
            frames += [_frame(name, project, 6 + s, 2 + s, t + 6 + s, loss=9.0 + s)
                       for s in range(3)]
            frames += [_frame(name, project, 0, 40, t + 9, rank=1, loss=math.nan),
                       _frame(name, project, 20, 7, t + 10)]
        if kind == 8:  # the newest losses are history steps, the last one NaN for odd i
            frames.append(_frame(name, project, 30, 20, t + 20, history={
                "steps": [17, 18, 19], "scalars": {"loss": [1.5, None,
                                                            math.nan if i % 2 else 1.25]}}))
        if kind == 9:
            frames = [_frame(name, project, s, s, t + s) for s in range(4)]
        if frames and not plain:  # a late batch first: the older one must not win
            ingest(session, frames[-2:], now=NOW)
            ingest(session, frames[:-2], now=NOW)
        elif frames:
            ingest(session, frames, now=NOW)
        if kind in (1, 5, 6):
            ingest(session, [_frame(name, project, 99, 5, t + 50, end=True)], now=NOW)
        run_id = session.query(Run.id).filter_by(project=project, name=name).scalar()
        if not plain:
            tags = [["tag-a"], ["exp:1", "tag-b"], [], []][i % 4]
            if tags:
                set_tags(session, run_id, add=tags)
            config = CONFIGS[i % 5]
            if config is not None:
                set_config(session, run_id, config)
        alerts = _alerts(run_id, 4 if plain else i % 6)
        if kind == 2:
            alerts.append(_alert(run_id, "no_data", "firing", 6))
            session.execute(update(Run).where(Run.id == run_id).values(status="stopped"))
        if kind == 3:
            alerts.append(_alert(run_id, "loss_nonfinite", "firing", 5, severity="critical"))
            alerts.append(_alert(run_id, "grad_spike", "firing", 5, suppressed="inhibited"))
            session.execute(update(Run).where(Run.id == run_id).values(diverged_step=5))
        if kind == 6:
            alerts = []
        session.add_all(alerts)
        session.commit()


def _alerts(run_id: int, pattern: int) -> list[Alert]:
    a = _alert
    return [
        [],
        [a(run_id, "grad_spike", "resolved", 2, resolved=3, severity="info")],
        [a(run_id, "grad_spike", "resolved", 1, resolved=2), a(run_id, "loss_jump", "firing", 4)],
        [a(run_id, "grad_spike", "resolved", 1, resolved=5), a(run_id, "loss_jump", "firing", 3,
                                                              severity="critical")],
        [a(run_id, "grad_spike", "firing", 3)],
        [a(run_id, "grad_spike", "resolved", 4, resolved=2), a(run_id, "loss_jump", "resolved",
                                                               3, resolved=4),
         a(run_id, "grad_spike", "firing", 5)],
    ][pattern]


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    migrate(e)
    with Session(e) as s:
        seed(s, 0, 30)
    yield e
    e.dispose()


def dumped(rows: list[Any]) -> list[Any]:
    return [r.model_dump(mode="json") for r in rows]


@contextmanager
def counted(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements run on ``engine`` inside the block, and a ``<load ID>`` line each
    time a row of ``runs`` is made into a Run object (again, once the last was dropped)."""
    out: list[str] = []

    def run(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        out.append(statement)

    def load(target: Run, *_: Any) -> None:
        out.append(f"<load {target.id}>")

    event.listen(engine, "before_cursor_execute", run)
    event.listen(Run, "load", load)
    try:
        yield out
    finally:
        event.remove(engine, "before_cursor_execute", run)
        event.remove(Run, "load", load)


def _reads_frames(stmts: list[str]) -> list[str]:
    return [x for x in stmts if "frames" in x]


def _runs_read(stmts: list[str]) -> int:
    """How many distinct runs were made into Run objects."""
    return len({x for x in stmts if x.startswith("<load ")})


PAGES = [(None, 0), (3, 0), (4, 2), (50, 7)]


def test_runs_list_answers_as_before_reading_its_page_alone(engine: Engine) -> None:
    """Same rows, order, totals, statuses, verdicts and sparklines as before, for every
    filter and page; and the runs read are the page's (before: every stored run)."""
    old_cache, new_cache = OldSparklineCache(), SparklineCache()
    asks: list[dict[str, Any]] = [
        {"project": p, "status": st, "alerting": al}
        for p in (None, "p2") for st in (None, *STATUSES) for al in (False, True)]
    asks += [{"q": q} for q in NEEDLES]
    asks += [{"q": q, "status": st, "project": "p1"} for q in ("run", "wiki") for st in STATUSES]
    seen, hits = set(), {}
    for ask in asks:
        for limit, offset in PAGES:
            kw = {**ask, "limit": limit, "offset": offset}
            old_total: list[int] = []
            with Session(engine) as s:
                old = dumped(old_runs_overview(s, old_cache, total=old_total, **kw))
            total: list[int] = []
            with Session(engine) as s, counted(engine) as stmts:
                new = dumped(runs_overview(s, new_cache, total=total, **kw))
            assert (new, total) == (old, old_total), kw
            assert _runs_read(stmts) == len(new), kw
            seen.update((r["status"], r["verdict"]) for r in old)
            hits[ask.get("q")] = old_total[0]
    # the store is varied enough to mean something
    assert {s for s, _ in seen} == set(STATUSES)
    assert {"diverged", "stopped", "finished", "finished_alerting", "warning", "healthy",
            "empty"} <= {v for _, v in seen}
    # the text filter reads compact JSON, non-ASCII as typed, the whole line case-folded
    assert all(hits[q] for q in ("WIKIPÉDIA", "pédia", '"lr":0.1', "i\u0307stanbul",
                                 "kelvin", "é", "p2 ", "proj-3 tag", "e-05"))
    assert hits["zzz"] == hits["istanbul"] == 0


def test_runs_api_list_and_run_answer_as_before_without_frames(engine: Engine) -> None:
    """``GET /runs`` and ``GET /runs/{run}`` as before (``last_frame_id`` included), with
    no statement that reads ``frames`` (before: ``max(frames.id)`` per run)."""
    now = time.time()
    for status in (None, "running", "finished", "stopped", "diverged", "alerting", "idle"):
        for project in (None, "Proj-3"):
            for limit, offset in PAGES:
                kw: dict[str, Any] = {"status": status, "project": project, "limit": limit,
                                      "offset": offset, "now": now}
                with Session(engine) as s:
                    old_total: list[int] = []
                    old = dumped(old_list_runs(s, total=old_total, **kw))
                with Session(engine) as s, counted(engine) as stmts:
                    total: list[int] = []
                    assert (dumped(list_runs(s, total=total, **kw)), total) == (old, old_total)
                assert not _reads_frames(stmts)
    with Session(engine) as s:
        ids = [r.id for r in old_list_runs(s)]
        assert any(old_get_run(s, i).last_frame_id for i in ids)
        for i in ids:
            with counted(engine) as stmts:
                new = get_run(s, i).model_dump(exclude={"active"})
            assert new == old_get_run(s, i).model_dump(exclude={"active"})
            assert not _reads_frames(stmts)


def test_alerts_inbox_answers_as_before_without_frames(engine: Engine) -> None:
    """The inbox as before for every state, project and limit; no statement reads frames
    (before: each run's sparkline and ``max(frames.id)``)."""
    old_cache = OldSparklineCache()
    kinds = set()
    for state in (None, "firing", "resolved"):
        for project in (None, "p1", "p2"):
            for limit in (1, 3, 100):
                kw: dict[str, Any] = {"project": project, "state": state, "limit": limit}
                with Session(engine) as s:
                    old = dumped(old_alerts_inbox(s, old_cache, **kw))
                with Session(engine) as s, counted(engine) as stmts:
                    assert dumped(alerts_inbox(s, **kw)) == old, kw
                assert not _reads_frames(stmts), kw
                kinds.update(e["verdict"]["kind"] for e in old)
    assert {"diverged", "stopped", "warning"} <= kinds


def test_run_page_verdict_as_before_without_the_loss_series(engine: Engine) -> None:
    """The run page's verdict reads the run's last loss from ``runs`` (before: its
    sparkline, every loss point of the run on a cold cache)."""
    old_cache = OldSparklineCache()
    settings = Settings(db_url=str(engine.url))
    with Session(engine) as s:
        for r in old_list_runs(s):
            alerts = list_alerts(s, r.id)
            found = inc.incidents(alerts, r.diverged_step)
            old = inc.verdict(r, alerts, found, last_loss=old_last_loss(s, old_cache, r))
            with counted(engine) as stmts:
                assert run_page_data(r.id, s, settings).verdict == old, r.name
            assert not [x for x in stmts if "points" in x], r.name


ASKS: dict[str, Any] = {
    "runs list, stopped": lambda s: runs_overview(s, SparklineCache(), status="stopped",
                                                  limit=2, total=[]),
    "runs list, diverged in p1": lambda s: runs_overview(s, SparklineCache(), project="p1",
                                                         status="diverged", limit=2, total=[]),
    "runs list, q": lambda s: runs_overview(s, SparklineCache(), q="wiki", limit=2, total=[]),
    "runs list, page 2": lambda s: runs_overview(s, SparklineCache(), limit=2, offset=2,
                                                 total=[]),
    "inbox, resolved": lambda s: alerts_inbox(s, state="resolved", limit=2),
    "inbox, firing": lambda s: alerts_inbox(s, state="firing", limit=2),
    "inbox": lambda s: alerts_inbox(s, limit=2),
    "GET /runs": lambda s: list_runs(s, limit=2, total=[]),
    "GET /runs/1": lambda s: get_run(s, 1),
}


def _work(engine: Engine) -> dict[str, tuple[int, int]]:
    """Statements and Run rows loaded of each of :data:`ASKS`, cold."""
    got = {}
    for name, ask in ASKS.items():
        with Session(engine) as s, counted(engine) as stmts:
            ask(s)
        got[name] = (sum(not x.startswith("<load ") for x in stmts), _runs_read(stmts))
    return got


def test_work_is_the_pages_not_the_stores(engine: Engine) -> None:
    """30 more runs that none of the asks keep (running, firing alerts only: the ones the
    old inbox walked first for ``state=resolved``) change neither the statements nor the
    runs read: one query for a page's runs, not one per run, and no run read to be left
    out. A cold page's sparklines are one query, not one per run."""
    before = _work(engine)
    with Session(engine) as s:
        seed(s, 1000, 30, plain=True)
    assert _work(engine) == before
    with Session(engine) as s:  # and still as before
        assert dumped(alerts_inbox(s, state="resolved", limit=5)) == \
            dumped(old_alerts_inbox(s, OldSparklineCache(), state="resolved", limit=5))
    with Session(engine) as s, counted(engine) as stmts:
        runs_overview(s, SparklineCache(), limit=40)
    assert len([x for x in stmts if "points" in x]) == 1


def test_a_page_over_months_reads_its_points_a_week_at_a_time(engine: Engine) -> None:
    """A cold page's sparklines: one query on SQLite; on a store partitioned by time, one
    per week of days its runs cover (each planning those days' partitions only), whatever
    its number of runs; the same sparklines as one query a run."""
    with Session(engine) as s:
        for k, days in enumerate((30, 31, 60)):  # three more runs: two weeks more
            t = T0 + days * DAY
            ingest(s, [_frame(f"later-{k}", "p1", i, i, t + i, loss=2.0 - i / 10)
                       for i in range(5)], now=NOW)
        s.commit()
    with Session(engine) as s, counted(engine) as stmts:
        new = dumped(runs_overview(s, SparklineCache(), limit=100))
    with Session(engine) as s:
        assert new == dumped(old_runs_overview(s, OldSparklineCache(), limit=100))
    reads = [x for x in stmts if "points" in x]
    assert len(reads) == (3 if engine.dialect.name == "postgresql" else 1), reads


def test_the_lists_never_read_frames(engine: Engine) -> None:
    """The runs' newest frame and last loss are on ``runs``: the runs list with a status
    or text filter reads no frame once its page's sparklines are cached (on a partitioned
    PostgreSQL each read of ``frames`` plans every partition)."""
    cache = SparklineCache()
    with Session(engine) as s:
        runs_overview(s, cache, limit=100)  # the sparklines, once
    for ask in (lambda s: runs_overview(s, cache, status="diverged", limit=100),
                lambda s: runs_overview(s, cache, q="wiki", limit=100)):
        with Session(engine) as s, counted(engine) as stmts:
            ask(s)
        assert not _reads_frames(stmts), stmts


def _columns(engine: Engine) -> list[tuple[Any, ...]]:
    from logitwatch.server.store.runs import last_loss

    with Session(engine) as s:
        return [(r.id, r.last_frame_id, _nan_safe(last_loss(r)), r.last_loss_step,
                 r.last_loss_seq) for r in s.query(Run).order_by(Run.id)]


def _nan_safe(v: float | None) -> Any:
    return "NaN" if v is not None and math.isnan(v) else v


def test_ingest_keeps_what_the_frames_say_and_0016_fills_it_in_alike(engine: Engine) -> None:
    """What ingest keeps on ``runs`` is what the frames say (max(frames.id), the
    sparkline's newest point), and migration 0016 computes the same from the frames of a
    store that predates it."""
    from alembic import command

    kept = _columns(engine)
    with Session(engine) as s:
        for rid, last_frame, loss, *_ in kept:
            run = old_get_run(s, rid)
            assert last_frame == (run.last_frame_id or None), run.name
            assert loss == _nan_safe(old_last_loss(s, SparklineCache(), run)), run.name
    assert {"NaN", math.inf, None} <= {k[2] for k in kept}
    cfg = alembic_config()
    for target in ("0015", "head"):
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.downgrade if target == "0015" else command.upgrade)(cfg, target)
    assert _columns(engine) == kept
    with engine.connect() as conn:  # NaN is not NULL, inf is inf, where the database can
        got = dict(conn.execute(text("SELECT name, last_loss_finite FROM runs")).all())
    assert got["run-003"] in (False, 0) and got["run-001"] in (True, 1)
    assert got["Run-Big-006"] is None  # empty
