"""One home for the default store, whatever the working directory: ``serve``, ``runs``,
``alerts``, ``replay``, ``push`` and the demo find the same data, and each says where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from logitwatch.cli import main
from logitwatch.client import ClientConfig
from logitwatch.paths import default_db_url, home
from logitwatch.server.settings import Settings
from tests.served import Served


def lw(*args: str, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``logitwatch ARGS`` as a separate process in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "logitwatch.cli", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def test_the_home_is_the_platform_data_dir_unless_named(tmp_path: Path) -> None:
    user = Path.home()
    if sys.platform.startswith("linux"):
        assert home({}) == user / ".local" / "share" / "logitwatch"
        assert home({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "logitwatch"
        assert home({"XDG_DATA_HOME": "relative/dir"}) == user / ".local/share/logitwatch"
    assert home({"LOGITWATCH_HOME": str(tmp_path / "h"), "XDG_DATA_HOME": "/x"}) == (
        tmp_path / "h")
    assert default_db_url({"LOGITWATCH_HOME": str(tmp_path)}) == (
        f"sqlite:///{tmp_path.resolve() / 'logitwatch.db'}")


def test_the_tests_never_use_the_real_home(logitwatch_home: Path) -> None:
    assert Settings().db_url == f"sqlite:///{logitwatch_home.resolve() / 'logitwatch.db'}"
    assert ClientConfig().spool_root() == str(logitwatch_home / "spool")


def test_what_serve_stored_is_found_from_any_directory(tmp_path: Path,
                                                       logitwatch_home: Path) -> None:
    """``serve`` started in one directory, ``runs list`` and ``alerts`` run in another: the
    same store (it was ./.logitwatch/ of each directory: "no runs" and a new empty file)."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    store = f"sqlite:///{logitwatch_home.resolve() / 'logitwatch.db'}"
    with Served(tmp_path, cwd=here) as col:
        frames = [{"run": "far-run", "seq": s, "step": s, "time": time.time(),
                   "scalars": {"loss": 2.0}} for s in range(3)]
        r = httpx.post(f"{col.url}/api/v1/ingest", json={"frames": frames}, timeout=10)
        assert r.status_code == 200, r.text
        listed = lw("runs", "list", cwd=there)
        alerts = lw("alerts", "--run", "far-run", cwd=there)
    assert f"store: {store}" in col.output
    assert listed.returncode == 0 and "far-run" in listed.stdout, listed
    assert f"store: {store}" in listed.stderr
    assert alerts.returncode == 0 and alerts.stdout.strip() == "no alerts", alerts
    assert f"store: {store}" in alerts.stderr
    assert not (here / ".logitwatch").exists() and not (there / ".logitwatch").exists()


def test_reading_an_absent_store_does_not_create_it(logitwatch_home: Path) -> None:
    r = CliRunner().invoke(main, ["runs", "list"])
    assert r.exit_code == 0 and r.stdout.startswith("no runs: no store at sqlite:///")
    r = CliRunner().invoke(main, ["alerts", "--run", "x"])
    assert r.exit_code == 1 and "no store at" in r.output and "logitwatch serve" in r.output
    assert not (logitwatch_home / "logitwatch.db").exists()


def test_every_command_names_its_store(tmp_path: Path, logitwatch_home: Path) -> None:
    store = f"store: sqlite:///{logitwatch_home.resolve() / 'logitwatch.db'}"
    run = CliRunner().invoke
    r = run(main, ["token", "list"])  # only reads: no store yet, and none made
    assert r.exit_code == 0 and store in r.stderr and "no tokens: no store" in r.output
    assert not (logitwatch_home / "logitwatch.db").exists()
    r = run(main, ["token", "create", "--project", "p", "--scope", "read"])  # makes it
    assert r.exit_code == 0 and store in r.stderr, r.output
    for args in (["token", "list"], ["runs", "list"], ["retention", "--older-than", "1"]):
        r = run(main, args)
        assert r.exit_code == 0 and store in r.stderr, (args, r.output)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    r = run(main, ["runs", "list", "--db", other])
    assert f"store: {other}" in r.stderr
    r = run(main, ["runs", "list", "--db", "postgresql+psycopg://u:secret@127.0.0.1:1/x"])
    assert "store: postgresql+psycopg://u:***@127.0.0.1:1/x" in r.stderr  # never the password

    frames = tmp_path / "frames.jsonl"
    frames.write_text("\n".join(json.dumps({"run": "rep", "seq": s, "step": s, "time": 1.0 + s,
                                            "scalars": {"loss": 2.0}}) for s in range(3)))
    r = run(main, ["replay", str(frames)])
    assert r.exit_code == 0, r.output
    assert f"{store} (its rules only; the replay goes to a temporary database" in r.stderr
    r = run(main, ["replay", str(frames), "--db", other])
    assert r.exit_code == 0 and f"store: {other}" in r.stderr

    r = run(main, ["push"])  # the default spool: $LOGITWATCH_HOME/spool here
    assert r.exit_code == 0 and f"spool: {logitwatch_home / 'spool'}" in r.stderr
    assert "nothing to push" in r.stdout


@pytest.mark.slow
def test_the_demo_runs_land_in_the_default_store(tmp_path: Path,
                                                 logitwatch_home: Path) -> None:
    """The demo writes where ``runs list`` reads, from any directory, and leaves nothing in
    the temporary directory (its jobs' summaries are read back and printed)."""
    here, there, tmp = tmp_path / "here", tmp_path / "there", tmp_path / "tmp"
    here.mkdir()
    there.mkdir()
    tmp.mkdir()
    demo = lw("demo", "--setting", "healthy", "--steps", "3", "--exit", "--port", "0",
              cwd=here, env={"TMPDIR": str(tmp)}, timeout=300)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert f"store: sqlite:///{logitwatch_home.resolve() / 'logitwatch.db'}" in demo.stderr
    assert "`logitwatch runs list` lists them from any directory" in demo.stdout
    listed = lw("runs", "list", cwd=there)
    assert listed.returncode == 0 and "healthy-" in listed.stdout, listed
    assert not (here / ".logitwatch").exists()
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("logitwatch-demo-")]
