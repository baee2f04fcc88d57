"""A run's lifecycle: running, finished (the job said it ended: an end frame), stopped (the
no_data alert), diverged; over the store and engine on SQLite and PostgreSQL, over the API,
and for real: a uvicorn collector, the client in this process and in job subprocesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.client import Client, ClientConfig
from logitwatch.demo.runner import Collector
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.app import create_app
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store import lifecycle
from logitwatch.server.store.queries import get_run, list_runs

HOUR = 3600.0


def frame(i: int, *, run: str = "r", rank: int = 0, seq: int | None = None,
          **scalars: Any) -> dict[str, Any]:
    return {"run": run, "rank": rank, "seq": i if seq is None else seq, "step": i * 10,
            "time": 1000.0 + i, "scalars": scalars or {"loss": 2.0}}


def end(i: int, *, run: str = "r", rank: int = 0, seq: int | None = None) -> dict[str, Any]:
    """The end frame a client sends after its frame ``i``."""
    return {"run": run, "rank": rank, "seq": i + 1 if seq is None else seq, "step": i * 10,
            "time": 1000.5 + i, "end": "finished"}


class Feed:
    """Batches through the collector's write path: lifecycle, engine, finished runs."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.engine = AlertEngine()

    def __call__(self, *frames: dict[str, Any],
                 now: float | None = None) -> tuple[int, int, list[Alert]]:
        """``now``: the collector's clock when the batch arrives; by default the batch's
        newest frame time (the two clocks agree)."""
        with session_scope(self.sessions) as s:
            body = IngestIn.model_validate({"frames": list(frames)})
            now = max(f["time"] for f in frames) if now is None else now
            result, finished = lifecycle.ingest(s, body.frames, now=now)
            changed = self.engine.process(s, result.new_frames)
            if finished:
                changed += self.engine.check_stale(s, runs=finished)
            return result.accepted, result.duplicates, changed

    def stale(self, now: float, listening_since: float | None = None) -> list[Alert]:
        with session_scope(self.sessions) as s:
            return self.engine.check_stale(s, now=now, listening_since=listening_since)

    def run(self, name: str = "r") -> Any:
        with session_scope(self.sessions) as s:
            rid = s.scalar(select(Run.id).where(Run.name == name))
            return get_run(s, rid)

    def alerts(self, rule: str = "no_data") -> list[Alert]:
        with self.sessions() as s:
            return list(s.scalars(select(Alert).where(Alert.rule == rule).order_by(Alert.id)))


def test_a_finished_run_gets_no_no_data(sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(5)])
    assert feed.run().status == "running"
    assert feed(end(4)) == (1, 0, [])
    run = feed.run()
    assert (run.status, run.end_step, run.ended_at) == ("finished", 40, 1004.5)
    assert feed.stale(now=1004.0 + HOUR) == [] and feed.alerts() == []
    assert feed(end(4))[:2] == (0, 1)  # a resend: a duplicate


def test_an_unclosed_run_is_stopped_then_running_again(sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(5)])
    fired = feed.stale(now=1004.0 + HOUR)
    assert [a.rule for a in fired] == ["no_data"] and fired[0].paged_step == 40
    assert "did not say it ended" in fired[0].message
    assert feed.run().status == "stopped"
    feed(frame(5))  # it was only slow
    assert feed.run().status == "running" and feed.alerts()[0].state == "resolved"


def test_a_skewed_job_clock_is_neither_stopped_nor_missed(
        sessions: sessionmaker[Session]) -> None:
    """no_data is judged by when the collector received the frames, not by the times the
    job stamped on them: a job whose clock is 20 minutes behind is not stopped while it
    reports (it was, at every check, and paged again at each new step); one 20 minutes
    ahead is still stopped 10 minutes after it falls silent."""
    feed = Feed(sessions)
    behind = 1000.0 + 20 * 60  # the collector's clock when frames stamped 1000+ arrive
    for i in range(5):
        feed(frame(i), now=behind + i)
        assert feed.stale(now=behind + i + 30) == []  # the collector's checks meanwhile
    run = feed.run()
    assert (run.status, run.active, run.last_time, run.seen_at) == (
        "running", False, 1004.0, behind + 4)  # `active` is judged by the wall clock
    assert feed.stale(now=behind + 4 + 599) == []
    fired = feed.stale(now=behind + 4 + 601)
    assert [a.rule for a in fired] == ["no_data"] and "no data for 601 s" in fired[0].message
    assert fired[0].evidence["seen_at"] == behind + 4
    ahead = Feed(sessions)
    ahead(frame(0, run="fast"), now=1000.0 - 20 * 60)
    (nd,) = [a for a in ahead.stale(now=1000.0 - 20 * 60 + 601)]
    assert nd.rule == "no_data" and "fast: no data for 601 s since step 0" in nd.message


def test_a_collector_outage_is_not_the_jobs_silence(sessions: sessionmaker[Session]) -> None:
    """A collector back from an hour's outage fires no no_data before it has listened for
    the rule's seconds itself: its jobs' clients resend within their backoff (30 s at
    most); one that does not is paged then, with its whole silence."""
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(3)])
    feed(*[frame(i, run="dead") for i in range(3)])
    back = 1002.0 + HOUR  # the collector restarts
    assert feed.stale(now=back + 30, listening_since=back) == []
    assert feed.stale(now=back + 30) != []  # what the check said before (undone below)
    with session_scope(sessions) as s:
        for a in s.scalars(select(Alert)):
            s.delete(a)
        s.execute(update(Run).values(status="running"))
    feed(frame(3), now=back + 35)  # "r"'s client resends; "dead" never does
    assert feed.stale(now=back + 599, listening_since=back) == []
    (nd,) = feed.stale(now=back + 601, listening_since=back)
    assert nd.message.startswith("dead: no data for 4201 s since step 20")


def test_an_open_no_data_resolves_when_the_run_finishes(
        sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(5)])
    assert len(feed.stale(now=1004.0 + HOUR)) == 1  # the link was down, the job went on
    _, _, changed = feed(end(4))  # its end frame, replayed from its spool
    (nd,) = feed.alerts()
    assert (nd.state, nd.resolved_step) == ("resolved", 40) and nd.id in {a.id for a in changed}
    assert feed.run().status == "finished"


def test_a_resumed_run_is_running_again(sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(5)], end(4))  # one batch: frames and the end
    assert feed.run().status == "finished"
    # the job restarts from a checkpoint at step 20: its seqs follow the clock, above
    feed(frame(2, seq=100), frame(3, seq=101))
    run = feed.run()
    assert (run.status, run.ended_at, run.end_step) == ("running", None, None)
    assert feed.stale(now=1004.0 + 60) == []  # its last frame is recent, not the old step
    assert feed(end(4, seq=50))[:2] == (1, 0)  # the first life's end, pushed late: no effect
    assert feed.run().status == "running"
    feed(end(3, seq=102))
    assert (feed.run().status, feed.run().end_step) == ("finished", 30)


def test_rank_0_decides(sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i, rank=r) for i in range(3) for r in (0, 1)])
    feed(end(2, rank=1))
    assert feed.run().status == "running"
    feed(end(2, rank=0))
    assert feed.run().status == "finished"
    feed(frame(3, rank=1, seq=200))  # another rank's late frame does not resume it
    assert feed.run().status == "finished"



def test_a_finished_run_gets_no_alert_for_what_came_after_its_end(
        sessions: sessionmaker[Session]) -> None:
    """Ranks 1 and 2 outlive rank 0's end frame and send a NaN loss: stored, judged by no
    rule (the run said it ended at step 20); data from before the end is still judged."""
    feed = Feed(sessions)
    feed(*[frame(i, rank=r) for i in range(3) for r in (0, 1, 2)], end(2, rank=0))
    assert feed.run().status == "finished"
    feed2 = Feed(sessions)  # a fresh engine, as after a collector restart
    for rank, f in ((1, feed), (2, feed2)):
        assert f(frame(3, rank=rank, seq=200, loss="NaN"))[2] == []  # step 30: after it
    assert feed.alerts("loss_nonfinite") == [] and feed.run().status == "finished"
    # a late frame from before the end (step 20) is judged as if it had come in time
    assert feed(frame(2, rank=2, seq=150, loss="NaN"))[2] != []
    assert [(a.rank, a.fired_step) for a in feed.alerts("loss_nonfinite")] == [(2, 20)]
    assert feed.run().status == "diverged"  # by its data before the end


def test_an_old_spool_past_the_last_lifes_end_step_does_not_resume_it(
        sessions: sessionmaker[Session]) -> None:
    """Life 1 stores steps 0-40 and crashes with steps 50-90 in its spool; life 2 resumes
    from step 20 and finishes at step 40. Life 1's spool, pushed late, goes past the end
    step but is numbered before the end frame: the run stays finished (a step rule resumed
    it, and a no_data page followed)."""
    feed = Feed(sessions)
    feed(*[frame(i, seq=1_000 + i) for i in range(5)])
    feed(*[frame(i, seq=2_000 + i) for i in range(2, 5)], end(4, seq=2_005))
    assert (feed.run().status, feed.run().end_step) == ("finished", 40)
    feed(*[frame(i, seq=1_000 + i) for i in range(5, 10)])
    assert (feed.run().status, feed.run().end_step) == ("finished", 40)
    assert feed.stale(now=1009.0 + HOUR) == []


def test_a_run_resumed_below_its_last_step_is_stopped_again(
        sessions: sessionmaker[Session]) -> None:
    """no_data fired at step 40; the job resumes from a checkpoint at step 20 (below the
    last step stored), then goes silent again: a new silence at the same last step, a new
    alert (the old one counted as this silence's, and the run stayed "running" for good)."""
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(5)])
    assert [a.fired_step for a in feed.stale(now=1004.0 + HOUR)] == [40]
    feed(frame(2, seq=100), frame(3, seq=101), now=1004.0 + HOUR + 10)
    assert feed.run().status == "running"
    assert feed.stale(now=1004.0 + HOUR + 20) == []  # not silent long enough
    again = feed.stale(now=1004.0 + 2 * HOUR + 20)
    assert [a.fired_step for a in again] == [40] and feed.run().status == "stopped"
    assert feed.stale(now=1004.0 + 3 * HOUR) == []  # one alert for one silence
    assert [a.state for a in feed.alerts()] == ["resolved", "firing"]
    # a checker whose clock is an hour ahead of the collector that takes the frames: the
    # next silence is a new one all the same (a check by fired_at >= seen_at missed it)
    feed(frame(5, seq=102), now=1004.0 + 2 * HOUR + 30)
    assert [a.fired_step for a in feed.stale(now=1004.0 + 4 * HOUR)] == [50]
    feed(frame(6, seq=103), now=1004.0 + 4 * HOUR - 100)  # behind the last check's clock
    assert [a.fired_step for a in feed.stale(now=1004.0 + 5 * HOUR + 20)] == [60]

def test_diverged_stays_diverged(sessions: sessionmaker[Session]) -> None:
    feed = Feed(sessions)
    feed(*[frame(i, loss=2.0 if i < 8 else "NaN") for i in range(10)])
    run = feed.run()
    assert (run.status, run.diverged_step) == ("diverged", 80)
    feed(end(9))
    run = feed.run()
    assert (run.status, run.end_step) == ("diverged", 90)  # it ended, after diverging
    with session_scope(sessions) as s:
        assert [r.name for r in list_runs(s, status="diverged")] == ["r"]
        assert list_runs(s, status="finished") == []


@pytest.mark.parametrize(("length", "status"), [(40, "running"), (1000, "diverged")])
def test_a_loss_jump_diverges_the_run_once_it_pages(sqlite_url: str, length: int,
                                                    status: str) -> None:
    """A loss bump of +11 nats from step 400: held at info while it may recover (a bad
    batch: the run did not diverge), critical once it persists (the run diverged)."""
    engine = make_engine(sqlite_url)
    migrate(engine)
    try:
        feed = Feed(sessionmaker(engine, expire_on_commit=False))
        frames = [{"run": "r", "rank": 0, "seq": s + 1, "step": s, "time": 1000.0 + s,
                   "scalars": {"loss": 3.0 + (11.0 if 400 <= s < 400 + length else 0.0),
                               "lr": 1e-3}} for s in range(700)]
        for i in range(0, len(frames), 50):
            feed(*frames[i:i + 50])
        (jump,) = feed.alerts("loss_jump")
        run = feed.run()
        assert (run.status, jump.fired_step) == (status, 400)
        assert run.diverged_step == (400 if status == "diverged" else None)
    finally:
        engine.dispose()


def test_the_collectors_checker_listens_before_it_fires(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running collector's own no-data checker (checking every 50 ms, no_data after
    3 s): a run last heard from an hour before the collector started is paged once the
    collector has listened for 3 s, not at its first checks; a run that reports meanwhile
    is not paged."""
    from logitwatch.server.alerts import config
    from logitwatch.server.alerts.defaults import RULES_ENV

    rules = tmp_path / "rules.yaml"
    rules.write_text("- {name: no_data, kind: no_data, metric: '*', severity: warning, "
                     "params: {seconds: 3.0}}\n")
    monkeypatch.setenv(RULES_ENV, str(rules))
    monkeypatch.setattr(config, "STALE_CHECK_S", 0.05)
    engine = make_engine(sqlite_url)
    migrate(engine)
    hour_ago = time.time() - HOUR
    with session_scope(sessionmaker(engine)) as s:
        for name in ("dead", "alive"):
            s.add(Run(project="default", name=name, created_at=hour_ago, last_step=20,
                      last_time=hour_ago, seen_at=hour_ago))
    engine.dispose()
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:

        def alerts() -> list[dict[str, Any]]:
            return [a for rid in (1, 2) for a in c.get(f"/api/v1/runs/{rid}/alerts").json()]

        started = time.time()
        for i in range(3, 18):  # "alive"'s client is back and sends every 0.25 s
            body = {"frames": [{**frame(i, run="alive"), "time": time.time()}]}
            assert c.post("/api/v1/ingest", json=body).status_code == 200
            if time.time() - started < 2.5:
                assert alerts() == []  # listened too briefly
            time.sleep(0.25)
        deadline = time.time() + 10
        while not (fired := alerts()) and time.time() < deadline:
            time.sleep(0.05)
        assert [(a["run"], a["rule"]) for a in fired] == [("dead", "no_data")], fired
        assert "no data for 36" in fired[0]["message"]  # its whole silence: an hour and more
        assert time.time() - started >= 3.0


def test_an_end_frame_carries_nothing_else() -> None:
    with pytest.raises(ValueError, match="end frame carries no scalars"):
        IngestIn.model_validate({"frames": [{**end(1), "scalars": {"loss": 1.0}}]})
    with pytest.raises(ValueError):
        IngestIn.model_validate({"frames": [{**end(1), "end": "crashed"}]})


def test_api_statuses_and_filters(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        now = time.time()
        for name in ("a", "b"):
            body = {"frames": [{**frame(i, run=name), "time": now} for i in range(3)]}
            assert c.post("/api/v1/ingest", json=body).status_code == 200
        # an end frame through the fast parser's path (it hands end frames to the model)
        r = c.post("/api/v1/ingest", json={"frames": [{**end(2, run="b"), "time": now}]})
        assert r.status_code == 200 and r.json()["accepted"] == 1
        runs = {x["name"]: x for x in c.get("/api/v1/runs").json()}
        assert runs["a"]["status"] == "running" and runs["a"]["ended_at"] is None
        b = runs["b"]
        assert (b["status"], b["end_step"], b["ended_at"], b["active"]) == (
            "finished", 20, now, True)
        assert c.get(f"/api/v1/runs/{b['id']}").json()["status"] == "finished"
        names = [x["name"] for x in c.get("/api/v1/runs", params={"status": "finished"}).json()]
        assert names == ["b"]
        dash = {x["name"]: x["status"] for x in c.get("/api/v1/dashboard/runs").json()}
        assert dash == {"a": "running", "b": "finished"}


# -- for real: a uvicorn collector, the client, job processes ----------------------------


def runs_of(url: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in httpx.get(f"{url}/api/v1/runs", timeout=10).json()}


def stale_an_hour_later(db_url: str) -> list[str]:
    """What the no-data check fires an hour from now, as the collector's would."""
    engine = make_engine(db_url)
    try:
        with session_scope(sessionmaker(engine, expire_on_commit=False)) as s:
            runs = {r.id: r.name for r in s.scalars(select(Run))}
            return sorted(runs[a.run_id] for a in AlertEngine().check_stale(
                s, now=time.time() + HOUR))
    finally:
        engine.dispose()


def test_closed_and_unclosed_runs_for_real(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import logitwatch

    db = f"sqlite:///{tmp_path / 'c.db'}"

    def train(run: str, url: str) -> Any:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = logitwatch.attach(model, opt, run=run, url=url, sample_every=2,
                                overhead_budget=None)
        for _ in range(6):
            idx = torch.randint(0, 32, (4, 8))
            loss = torch.nn.functional.cross_entropy(model(idx).reshape(-1, 32),
                                                     idx.reshape(-1))
            mon.log(loss=loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return mon

    with Collector(db) as col:
        train("closed", col.url).close(timeout=30)
        hung = train("unclosed", col.url)
        assert hung.client.flush(30)
        runs = runs_of(col.url)
        # its last step: the 6th, not sampled (every 2nd is)
        assert (runs["closed"]["status"], runs["closed"]["end_step"]) == ("finished", 5)
        assert runs["unclosed"]["status"] == "running"
        # an hour later: the finished run is quiet, the other one is reported stopped
        assert stale_an_hour_later(db) == ["unclosed"]
        runs = runs_of(col.url)
        assert (runs["closed"]["status"], runs["unclosed"]["status"]) == ("finished",
                                                                          "stopped")
        hung.close(timeout=30, finished=False)


JOB = textwrap.dedent("""
    import sys
    from logitwatch.client import Client, ClientConfig
    url, run, how, spool = sys.argv[1:]
    c = Client(url, run=run, config=ClientConfig(interval=0.05, spool_dir=spool))
    for step in range(5):
        c.send(step, {"loss": 2.0}, {})
    if how == "raise":
        raise RuntimeError("the training step failed")
    # "exit": the interpreter exits normally, the job never closed its client
""")


@pytest.mark.parametrize(("how", "status"), [("exit", "finished"), ("raise", "running")])
def test_a_job_process_that_exits(tmp_path: Path, how: str, status: str) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with Collector(db) as col:
        done = subprocess.run([sys.executable, "-c", JOB, col.url, how, how,
                               str(tmp_path / "spool")], capture_output=True, text=True,
                              timeout=60)
        assert (done.returncode == 0) == (how == "exit"), done.stderr
        run = runs_of(col.url)[how]
        assert (run["status"], run["last_step"]) == (status, 4)
        assert stale_an_hour_later(db) == ([] if how == "exit" else ["raise"])
        if how == "raise":
            assert runs_of(col.url)["raise"]["status"] == "stopped"


def test_the_end_frame_waits_in_the_spool_while_the_collector_is_down(
        tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    col = Collector(db)
    client = Client(col.url, run="late", config=ClientConfig(
        interval=0.05, max_backoff=0.2, spool_interval=0.05, timeout=2.0,
        spool_dir=str(tmp_path / "spool")))
    try:
        for step in range(4):
            client.send(step, {"loss": 2.0}, {})
        client.finish()  # the job ended while the collector was down
        deadline = time.monotonic() + 20
        while client.stats["spooled"] < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.stats["spooled"] == 5
        with col:  # it comes back: the client replays its spool, end frame last
            assert client.flush(30)
            run = runs_of(col.url)["late"]
            assert (run["status"], run["end_step"]) == ("finished", 3)
    finally:
        client.shutdown(5.0)


def test_two_collectors_page_a_silent_run_once(sessions: sessionmaker[Session]) -> None:
    """Two collectors on one database run their no-data checks at the same moment: one
    alert, one page. On PostgreSQL the second check's UPDATE waits for the first's commit,
    then matches nothing; on SQLite the writes take turns."""
    feed = Feed(sessions)
    feed(*[frame(i) for i in range(3)])
    first = sessions()
    fired_first = AlertEngine().check_stale(first, now=1002.0 + HOUR)  # not committed yet
    assert [a.rule for a in fired_first] == ["no_data"]
    second: list[Alert] = []
    errors: list[BaseException] = []

    def other_collector() -> None:
        try:
            with session_scope(sessions) as s:
                second.extend(AlertEngine().check_stale(s, now=1002.0 + HOUR))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    if sessions.kw["bind"].dialect.name == "postgresql":
        t = threading.Thread(target=other_collector)
        t.start()
        t.join(1.0)
        assert t.is_alive()  # waiting on the first check's row lock
        first.commit()
        t.join(10)
    else:
        first.commit()
        other_collector()
    first.close()
    assert errors == [] and second == []
    assert len(feed.alerts()) == 1 and feed.run().status == "stopped"
