"""The live stream's polls on PostgreSQL's day partitions (``server/store/live.py``): each
poll's reads carry time bounds, so the planner plans the partitions of the run's days only,
not every day kept (42 ms of planning a poll at 410 partitions), and the stream still sends
every frame: one stored late with an older time (a job resumed on a host whose clock is
behind), and one committed between the read of the run's bounds and the read of the page,
outside the bounds read (the page is read again with the bounds its statement saw)."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.app import create_app
from logitwatch.server.db.partitions import DAY, ensure_partitions, partition_name
from logitwatch.server.db.session import make_engine, session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store.ingest import ingest_frames
from logitwatch.server.store.live import frames_since
from tests.pg import pg_database
from tests.test_partitions import assert_plans_only, frame, post

#: Days of partitions made before the run's (a store that keeps a month of other runs).
KEPT_DAYS = 30


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new PostgreSQL database (skipped without LOGITWATCH_TEST_PG_URL, as elsewhere)."""
    yield from pg_database()


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    e = make_engine(pg_url)
    yield e
    e.dispose()


def _days(*days: int) -> set[str]:
    return {partition_name(t, d) for t in ("frames", "points") for d in days}


class Reads:
    """The SELECTs on ``frames`` or ``points`` an engine runs meanwhile on behalf of the
    function ``caller`` (found on the Python stack; an ingest's are not), whichever thread
    runs them (the stream polls in the server's worker threads)."""

    def __init__(self, engine: Engine, caller: str) -> None:
        self.engine, self.caller = engine, caller
        self.seen: list[tuple[str, Any]] = []

    def __enter__(self) -> Reads:
        event.listen(self.engine, "before_cursor_execute", self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._note)

    def _note(self, _c: Any, _cur: Any, statement: str, params: Any, *_: Any) -> None:
        if not (statement.lstrip().upper().startswith("SELECT")
                and ("frames" in statement or "points" in statement)):
            return
        names = {f.name for f in traceback.extract_stack()}
        if self.caller in names and "ingest_frames" not in names:
            self.seen.append((statement, params))


def _frame_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The ``frame`` events' data of an event stream's lines."""
    event_name = None
    for line in lines:
        if line.startswith("event:"):
            event_name = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event_name == "frame":
            yield json.loads(line[5:])


def test_the_streams_polls_plan_only_the_runs_days(pg_url: str, pg: Engine) -> None:
    """The real route, polling: its reads plan the partitions of the days the run covers
    (yesterday's; then from three days back, the day of a frame stamped then and stored
    while the stream is open), not the month kept nor the week ahead. The late frame is
    sent: a lower bound from what the stream had sent (yesterday) would have skipped it."""
    now = time.time()
    today = int(now // DAY)
    old = (today - 1) * DAY + 100
    late = (today - 3) * DAY + 100  # stored after yesterday's frames, stamped before them
    settings = Settings(db_url=pg_url, rate_limit_per_second=0, stream_interval=0.05)
    with TestClient(create_app(settings)) as c:
        ensure_partitions(pg, now=now - KEPT_DAYS * DAY, ahead_days=KEPT_DAYS)
        assert post(c, [frame(i, old + i) for i in range(4)])["accepted"] == 4
        polls = Reads(c.app.state.db, "poll")
        with polls, c.stream("GET", "/api/v1/runs/1/stream") as r:
            assert r.status_code == 200
            got = _frame_events(r.iter_lines())
            first = next(got)
            assert [f["step"] for f in first["frames"]] == [0, 10, 20, 30]
            assert first["latest"]["step"] == 30
            assert polls.seen
            assert_plans_only(pg, polls.seen, _days(today - 1))
            polls.seen.clear()
            assert post(c, [frame(4, old + 4), frame(5, late)])["accepted"] == 2
            second = next(got)
        assert [f["step"] for f in second["frames"]] == [40, 50]
        assert [f["scalars"]["loss"] for f in second["frames"]] == pytest.approx([2.96, 2.95])
        assert second["latest"] == {"step": 50, "attn.logit_max": [
            [float(5 + li + hi) for hi in range(3)] for li in range(2)]}
    assert polls.seen
    assert_plans_only(pg, polls.seen, _days(today - 3, today - 2, today - 1))


def test_a_frame_committed_between_the_bounds_and_the_page_is_sent(
        pg_url: str, pg: Engine) -> None:
    """An ingest commits, between the poll's read of the run's bounds and its read of the
    page, a frame stamped before the bounds read and one after it within them: the page
    holds both (read with the bounds read first, it held the second alone, and the next
    poll starts after it: the first was never sent)."""
    now = time.time()
    today = int(now // DAY)
    old = (today - 1) * DAY + 100
    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        ensure_partitions(pg, now=now - KEPT_DAYS * DAY, ahead_days=KEPT_DAYS)
        assert post(c, [frame(i, old + 10 * i) for i in range(3)])["accepted"] == 3
    sessions = sessionmaker(pg, expire_on_commit=False)
    with session_scope(sessions) as s:
        after, frames, _ = frames_since(s, run_id=1, after_id=0)
    assert [f["step"] for f in frames] == [0, 10, 20]
    pages: list[str] = []

    def meanwhile(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        """Before the page's first read: another transaction stores a frame stamped two
        days before the run's bounds, then one within them (numbered after it)."""
        if "frames.id >" in statement and statement.lstrip().upper().startswith("SELECT"):
            pages.append(statement)
            if len(pages) == 1:
                body = [frame(3, old - 2 * DAY), frame(4, old + 5)]
                with Session(pg) as other, other.begin():
                    ingest_frames(other, IngestIn.model_validate({"frames": body}).frames)

    with Reads(pg, "frames_since") as reads:
        event.listen(pg, "before_cursor_execute", meanwhile)
        try:
            with session_scope(sessions) as s:
                last, frames, latest = frames_since(s, run_id=1, after_id=after)
        finally:
            event.remove(pg, "before_cursor_execute", meanwhile)
    assert len(pages) == 2  # read again with the bounds its first read saw
    assert [f["step"] for f in frames] == [30, 40]
    assert latest is not None and latest["step"] == 40
    with session_scope(sessions) as s:
        assert frames_since(s, run_id=1, after_id=last)[1] == []
    assert_plans_only(pg, reads.seen, _days(today - 3, today - 2, today - 1))
