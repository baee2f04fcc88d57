"""What the UI audit found the command line doing to a person: a traceback for a store a
newer logitwatch wrote, schema upgrades without a word, replayed runs reported as hung, a
progress line every 256 frames, a file path for --db without the URL to use instead, and
``retention --older-than 0`` thinning live runs without asking. The real CLI (click's
runner) on temporary SQLite stores."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result
from sqlalchemy import func, select, text
from sqlalchemy.orm import sessionmaker

import logitwatch._cli_progress as progress_module
from logitwatch.cli import main
from logitwatch.server.db.models import Point, Run
from logitwatch.server.db.session import (
    alembic_config,
    make_engine,
    migrate,
    schema_revision,
    session_scope,
)
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store import lifecycle
from tests.test_run_lifecycle import stale_an_hour_later

HOUR = 3600.0
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def lw(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input)


def store_at(url: str, revision: str) -> None:
    """A store whose schema is at ``revision`` (as an older logitwatch left it)."""
    engine = make_engine(url)
    try:
        cfg = alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return schema_revision(engine)
    finally:
        engine.dispose()


def one_line_error(r: Result) -> str:
    """The command's error: exit 1 through click (not an exception escaping it), one line."""
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)  # not an uncaught error
    assert "Traceback" not in r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, r.stderr
    assert r.stderr.rstrip().endswith(errors[0]), r.stderr  # nothing after it
    return errors[0]


# --- 1. a store from a newer logitwatch ---------------------------------------------------


@pytest.fixture
def future_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'future.db'}"
    engine = make_engine(url)
    try:
        migrate(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    finally:
        engine.dispose()
    return url


@pytest.mark.parametrize("args", [
    ["runs", "list"],
    ["alerts", "--run", "x"],
    ["token", "create", "--project", "p", "--scope", "read"],
    ["retention", "--older-than", "1"],
    ["serve", "--port", "0"],
], ids=lambda a: " ".join(a[:2]))
def test_a_store_from_a_newer_logitwatch_is_one_line_saying_what_to_do(
        future_store: str, args: list[str]) -> None:
    err = one_line_error(lw(*args, "--db", future_store))
    assert f"cannot use the store {future_store}" in err, err
    assert "'9999_future'" in err and "newer version" in err
    assert "Upgrade logitwatch" in err and "--db" in err
    assert revision_of(future_store) == "9999_future"  # left as it was


def test_replay_blames_a_newer_store_not_its_file(future_store: str, tmp_path: Path) -> None:
    data = tmp_path / "healthy_s0.jsonl"
    data.write_text("\n".join(json.dumps(f) for f in frames(5)) + "\n")
    err = one_line_error(lw("replay", str(data), "--db", future_store))
    assert f"cannot use the store {future_store}" in err and "'9999_future'" in err, err
    assert str(data) not in err


# --- 2. schema upgrades are announced ------------------------------------------------------


def upgrading(frm: str) -> str:
    return (f"store: upgrading the schema from {frm} to {HEAD} (an older logitwatch will "
            "refuse this store afterwards)... done")


def test_upgrading_an_old_store_says_so_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store_at(url, "0006")
    r = lw("runs", "list", "--db", url)
    assert r.exit_code == 0, r.output
    assert upgrading("0006") in r.stderr, r.stderr
    assert r.stdout.strip() == "no runs" and "upgrading the schema" not in r.stdout
    assert revision_of(url) == HEAD
    r = lw("runs", "list", "--db", url)  # at head now: nothing to say
    assert r.exit_code == 0 and "upgrading the schema" not in r.output, r.output
    fresh = f"sqlite:///{tmp_path / 'new.db'}"  # a new store: created, not upgraded
    r = lw("token", "create", "--project", "p", "--scope", "read", "--db", fresh)
    assert r.exit_code == 0 and "upgrading the schema" not in r.output, r.output


def test_serve_and_replay_say_they_upgrade_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store_at(url, "0006")
    # refused after the store is opened (no tokens on a public interface): nothing served
    r = lw("serve", "--host", "0.0.0.0", "--port", "0", "--db", url)
    assert r.exit_code == 1 and "refusing to serve" in r.output, r.output
    assert upgrading("0006") in r.stderr, r.stderr
    assert revision_of(url) == HEAD

    other = f"sqlite:///{tmp_path / 'old2.db'}"
    store_at(other, "0012")
    data = tmp_path / "f.jsonl"
    data.write_text("\n".join(json.dumps(f) for f in frames(5)) + "\n")
    r = lw("replay", str(data), "--db", other)
    assert r.exit_code == 0, r.output
    assert upgrading("0012") in r.stderr, r.stderr


# --- 3. replayed runs are finished, not "stopped" ------------------------------------------


def frames(n: int, run: str = "r", loss: Any = None) -> list[dict[str, Any]]:
    t0 = time.time() - 2 * HOUR
    return [{"run": run, "rank": 0, "seq": i, "step": 10 * i, "time": t0 + i,
             "scalars": {"loss": 2.5 - 0.001 * i if loss is None else loss(i)}}
            for i in range(n)]


def statuses(url: str) -> dict[str, tuple[str, Any, Any]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {r.name: (r.status, r.end_step, r.diverged_step) for r in conn.execute(
                select(Run.name, Run.status, Run.end_step, Run.diverged_step))}
    finally:
        engine.dispose()


def test_replayed_runs_are_finished_not_reported_stopped(tmp_path: Path) -> None:
    healthy = frames(40, "healthy")
    blowup = frames(60, "blowup", loss=lambda i: 2.5 - 0.001 * i if i < 30 else 50.0)
    ended = frames(10, "ended") + [{"run": "ended", "rank": 0, "seq": 10, "step": 90,
                                    "time": time.time() - HOUR, "end": "finished"}]
    data = tmp_path / "healthy_s0.jsonl.gz"
    with gzip.open(data, "wt") as fh:
        fh.write("\n".join(json.dumps(f) for f in healthy + blowup + ended) + "\n")
    url = f"sqlite:///{tmp_path / 'replayed.db'}"
    r = lw("replay", str(data), "--db", url)
    assert r.exit_code == 0, r.output
    assert stale_an_hour_later(url) == []  # no "no data: may have hung or crashed"
    got = statuses(url)
    assert got["healthy"] == ("finished", 390, None)
    assert got["blowup"][:2] == ("finished", 590) and got["blowup"][2] is not None  # diverged
    assert got["ended"] == ("finished", 90, None)  # by the file's own end frame
    assert (f"marked finished in {url}: default/blowup, default/healthy (a replayed run has "
            "no live job") in r.stderr, r.stderr
    r = lw("runs", "list", "--db", url)
    assert "stopped" not in r.stdout and r.stdout.count("finished") == 2, r.stdout
    assert "diverged" in r.stdout

    # replayed again, the same frames change nothing; more of the run resumes and ends it
    assert lw("replay", str(data), "--db", url).exit_code == 0
    more = tmp_path / "more.jsonl"
    later = frames(60, "healthy")[40:]
    more.write_text("\n".join(json.dumps(f) for f in later) + "\n")
    r = lw("replay", str(more), "--db", url)
    assert r.exit_code == 0 and "marked finished" in r.stderr, r.output
    assert statuses(url)["healthy"] == ("finished", 590, None)
    assert stale_an_hour_later(url) == []


def test_the_replay_help_says_runs_are_marked_finished() -> None:
    r = lw("replay", "--help")
    assert r.exit_code == 0
    assert "marked finished" in " ".join(r.output.split())


# --- 4. replay's progress --------------------------------------------------------------------


def progress_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip().endswith("%)")
            or line.strip().endswith("frames") and "/" in line and "replaying" not in line]


@pytest.mark.parametrize("tick, least, most", [(0.0, 0, 0), (0.25, 12, 17)])
def test_replay_progress_is_a_line_a_second_and_the_summary_is_always_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tick: float, least: int,
        most: int) -> None:
    """1,024 frames, judged 16 at a time, each time reported to the progress. A clock that
    stands still: no progress line (the old code printed one every 256 frames, whatever the
    time); one that moves a quarter of a second a report: a line every 4 reports (a second),
    not every one."""
    now = [0.0]

    def clock() -> float:
        now[0] += tick
        return now[0]

    monkeypatch.setattr(progress_module, "_clock", clock, raising=False)
    data = tmp_path / "big.jsonl"
    data.write_text("\n".join(json.dumps(f) for f in frames(1024)) + "\n")
    r = lw("replay", str(data))
    assert r.exit_code == 0, r.output
    lines = progress_lines(r.stderr)
    assert least <= len(lines) <= most, r.stderr
    assert "replayed 1024 frames of 1 run (default/r)" in r.stderr, r.stderr


# --- 5. a file path where a URL goes ---------------------------------------------------------


def test_a_file_path_for_db_gets_the_url_to_use(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.db"
    r = lw("serve", "--port", "0", "--db", str(path))
    err = one_line_error(r)
    assert f"sqlite:///{path}" in err and f"sqlite:////{str(path).lstrip('/')}" in err, err
    monkeypatch.chdir(tmp_path)
    r = lw("runs", "list", "--db", "rel.db")
    err = one_line_error(r)
    assert f"sqlite:///{tmp_path / 'rel.db'}" in err, err  # made absolute


# --- 6. retention asks before thinning live runs -----------------------------------------


def matrix(i: int) -> list[list[float]]:
    return [[1.0 + 0.01 * i] * 4] * 2


def seed_runs(url: str, *, live_age: float, old_age: float) -> None:
    """A run still running with frames ``live_age`` seconds old, and a finished run whose
    frames are ``old_age`` seconds old; both with per-head matrices."""
    engine = make_engine(url)
    migrate(engine)
    now = time.time()
    live = [{"run": "live", "seq": i, "step": i, "time": now - live_age + i,
             "scalars": {"loss": 2.0}, "heads": {"attn.logit_max": matrix(i)}}
            for i in range(20)]
    done = [{"run": "done", "seq": i, "step": i, "time": now - old_age + i,
             "scalars": {"loss": 2.0}, "heads": {"attn.logit_max": matrix(i)}}
            for i in range(20)]
    done.append({"run": "done", "seq": 20, "step": 19, "time": now - old_age + 20,
                 "end": "finished"})
    try:
        with session_scope(sessionmaker(engine, expire_on_commit=False)) as s:
            lifecycle.ingest(s, IngestIn.model_validate({"frames": live + done}).frames)
    finally:
        engine.dispose()


def points(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Point)).scalar_one())
    finally:
        engine.dispose()


def test_retention_of_everything_asks_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    seed_runs(url, live_age=600, old_age=10 * 86400)
    before = points(url)
    r = lw("retention", "--older-than", "0", "--bucket-steps", "10", "--db", url, input="n\n")
    assert r.exit_code == 1 and "Aborted" in r.output, r.output
    assert "every frame in 2 run(s), 1 of them still running (default/live)" in r.output
    assert points(url) == before  # nothing thinned
    r = lw("retention", "--older-than", "0", "--bucket-steps", "10", "--db", url)  # no input
    assert r.exit_code == 1 and points(url) == before, r.output
    r = lw("retention", "--older-than", "0", "--bucket-steps", "10", "--db", url, input="y\n")
    assert r.exit_code == 0 and "36 matrices" in r.output, r.output
    assert points(url) < before


def test_retention_reaching_into_a_live_run_asks_unless_yes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    seed_runs(url, live_age=600, old_age=10 * 86400)
    before = points(url)
    r = lw("retention", "--older-than", "0.001", "--bucket-steps", "10", "--db", url)
    assert r.exit_code == 1 and "1 of them still running (default/live)" in r.output, r.output
    assert points(url) == before
    # older data only (the finished run's): thinned without a question, as before
    r = lw("retention", "--older-than", "5", "--bucket-steps", "10", "--db", url)
    assert r.exit_code == 0 and "18 matrices" in r.output and "[y/N]" not in r.output, r.output
    r = lw("retention", "--older-than", "0.001", "--bucket-steps", "10", "--yes", "--db", url)
    assert r.exit_code == 0 and "18 matrices" in r.output and "[y/N]" not in r.output, r.output
