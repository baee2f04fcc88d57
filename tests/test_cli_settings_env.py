"""``logitwatch serve`` honours the ``LOGITWATCH_*`` settings that have an option too
(docs/SETTINGS.md: "a command line option, where there is one, wins"): the option given
wins, else the variable, else the default. ``--host`` / ``--port`` used to have fixed
defaults that always overrode ``LOGITWATCH_HOST`` / ``LOGITWATCH_PORT``, and insecure mode
turned on by ``LOGITWATCH_INSECURE_NO_AUTH`` started without its warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from logitwatch.cli import main
from logitwatch.demo.runner import free_port

#: the serve settings these tests set, never inherited from the environment they run in
_SERVE_VARS = ("LOGITWATCH_HOST", "LOGITWATCH_PORT", "LOGITWATCH_INSECURE_NO_AUTH",
               "LOGITWATCH_REQUIRE_TOKENS", "LOGITWATCH_DB_URL", "LOGITWATCH_WEBHOOK_URL")
_BANNER = re.compile(r"logitwatch collector on (\S+)")


@contextmanager
def served(tmp: Path, *args: str, timeout: float = 90, **env: str) -> Iterator[
        tuple[str, subprocess.Popen[bytes], Path, Path]]:
    """``logitwatch serve ARGS`` as a real process with ``env`` added (and the serve
    variables above unset unless given), a fresh SQLite store in ``tmp``; yields (the URL
    the banner names, the process, its stdout file, its stderr file) once it answers
    there. It is always stopped, killed if it will not stop."""
    base = {k: v for k, v in os.environ.items() if k not in _SERVE_VARS}
    out, err = tmp / "serve.out", tmp / "serve.err"
    cmd = [sys.executable, "-m", "logitwatch.cli", "serve", "--log-level", "warning",
           "--db", f"sqlite:///{tmp / 'served.db'}", *args]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env={**base, **env})
    try:
        deadline = time.monotonic() + timeout
        url = None
        while True:
            said = f"stdout: {out.read_text(errors='replace')[-2000:]}\nstderr: " \
                   f"{err.read_text(errors='replace')[-2000:]}"
            if url is None and (m := _BANNER.search(out.read_text(errors="replace"))):
                url = m.group(1)
            if url is not None:
                try:
                    if httpx.get(url + "/api/v1/session", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
            if proc.poll() is not None:
                raise AssertionError(f"serve exited ({proc.returncode}):\n{said}")
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not answer within {timeout} s:\n{said}")
            time.sleep(0.05)
        yield url, proc, out, err
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


def test_serve_listens_on_the_port_LOGITWATCH_PORT_names(tmp_path: Path) -> None:
    """``LOGITWATCH_PORT=P logitwatch serve`` printed and bound http://127.0.0.1:8000."""
    port = free_port()
    with served(tmp_path, LOGITWATCH_PORT=str(port)) as (url, _, _, _):
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/session", timeout=10
                         ).status_code == 200


def test_insecure_mode_from_its_variable_prints_the_warning(tmp_path: Path) -> None:
    """The red warning ``--insecure-no-auth`` prints, when only
    ``LOGITWATCH_INSECURE_NO_AUTH=1`` turns insecure mode on (on loopback here: the test
    opens no port to the network; the 0.0.0.0 case is below, without binding)."""
    port = free_port()
    with served(tmp_path, "--port", str(port), LOGITWATCH_INSECURE_NO_AUTH="1") as (
            url, _, _, err):
        assert url == f"http://127.0.0.1:{port}"
        assert ("WARNING: serving on 127.0.0.1 WITHOUT AUTHENTICATION"
                in err.read_text(errors="replace")), err.read_text(errors="replace")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What ``serve`` hands uvicorn, which is never run (nothing binds but the port check,
    which these tests also replace, so a port in use elsewhere cannot matter)."""
    import uvicorn

    import logitwatch.server.serving as serving

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.setattr(serving, "check_port", lambda host, port: None)
    for var in _SERVE_VARS:
        monkeypatch.delenv(var, raising=False)
    return calls


def test_an_option_wins_then_the_variable_then_the_default(
        tmp_path: Path, started: list[dict[str, Any]]) -> None:
    db = ["--db", f"sqlite:///{tmp_path / 'c.db'}"]
    runner = CliRunner()
    env = {"LOGITWATCH_HOST": "localhost", "LOGITWATCH_PORT": "8793"}

    r = runner.invoke(main, ["serve", *db], env=env)
    assert r.exit_code == 0, r.output
    assert (started[-1]["host"], started[-1]["port"]) == ("localhost", 8793)
    assert "collector on http://localhost:8793" in r.output

    r = runner.invoke(main, ["serve", *db, "--host", "127.0.0.1", "--port", "8794"], env=env)
    assert r.exit_code == 0, r.output
    assert (started[-1]["host"], started[-1]["port"]) == ("127.0.0.1", 8794)

    r = runner.invoke(main, ["serve", *db])
    assert r.exit_code == 0, r.output
    assert (started[-1]["host"], started[-1]["port"]) == ("127.0.0.1", 8000)

    # a bad variable is named as such, as a bad option is
    r = runner.invoke(main, ["serve", *db], env={"LOGITWATCH_PORT": "70000"})
    assert r.exit_code == 1 and "--port / LOGITWATCH_PORT: " in r.output, r.output
    assert len(started) == 3

    helped = runner.invoke(main, ["serve", "--help"])
    assert helped.exit_code == 0
    text = " ".join(helped.output.split())
    assert "$LOGITWATCH_HOST, else 127.0.0.1" in text, text
    assert "$LOGITWATCH_PORT, else 8000" in text, text


def test_insecure_variable_on_all_interfaces_warns_like_the_option(
        tmp_path: Path, started: list[dict[str, Any]]) -> None:
    """``LOGITWATCH_INSECURE_NO_AUTH=1 logitwatch serve --host 0.0.0.0`` started without
    the warning ``--insecure-no-auth`` prints."""
    db = ["--db", f"sqlite:///{tmp_path / 'c.db'}"]
    runner = CliRunner()
    flag = runner.invoke(main, ["serve", *db, "--host", "0.0.0.0", "--insecure-no-auth"])
    var = runner.invoke(main, ["serve", *db, "--host", "0.0.0.0"],
                        env={"LOGITWATCH_INSECURE_NO_AUTH": "1"})
    for r in (flag, var):
        assert r.exit_code == 0, r.output
        assert ("WARNING: serving on 0.0.0.0 WITHOUT AUTHENTICATION" in r.stderr), r.stderr
    assert [kw["host"] for kw in started] == ["0.0.0.0", "0.0.0.0"]
    # and the host can come from its variable too
    r = runner.invoke(main, ["serve", *db], env={"LOGITWATCH_INSECURE_NO_AUTH": "1",
                                                 "LOGITWATCH_HOST": "0.0.0.0"})
    assert r.exit_code == 0 and "serving on 0.0.0.0 WITHOUT AUTHENTICATION" in r.stderr, (
        r.output)


def test_demo_takes_its_port_from_logitwatch_port_and_says_a_bad_one_in_a_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``logitwatch demo`` used a fixed ``--port 8000`` whatever ``LOGITWATCH_PORT`` said.
    A port taken by another process, named by the variable: the demo stops before training
    and names that port; a variable that is no port: one line naming it, no traceback."""
    import socket

    for k in _SERVE_VARS:
        monkeypatch.delenv(k, raising=False)
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("LOGITWATCH_PORT", str(port))
        r = CliRunner().invoke(main, ["demo", "--db", db, "--exit", "--steps", "1",
                                      "--setting", "healthy"])
    assert r.exit_code == 1, r.output
    assert f"port {port} on 127.0.0.1 is already in use" in r.output
    monkeypatch.setenv("LOGITWATCH_PORT", "eighty")
    r = CliRunner().invoke(main, ["demo", "--db", db, "--exit"])
    assert r.exit_code == 1 and r.exception is not None
    assert isinstance(r.exception, SystemExit), r.exception  # a ClickException, not a crash
    assert "LOGITWATCH_PORT" in r.output, r.output
