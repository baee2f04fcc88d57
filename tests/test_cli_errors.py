"""What the command line and the client say when something is off: a port in use, options
without help, a push to the wrong place, a collector URL in the wrong form. Real processes,
a real collector on loopback, a real SQLite file."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import httpx
import pytest

from logitwatch.cli import main
from logitwatch.client import Client, ClientConfig
from logitwatch.client._url import normalize_url
from logitwatch.demo.runner import free_port
from tests.served import Served


def lw(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logitwatch.cli", *args], env=os.environ,
                          capture_output=True, text=True, timeout=timeout)


# --- serve -------------------------------------------------------------------------------


def test_serve_on_a_port_in_use_fails_before_its_banner() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = lw("serve", "--port", str(port))
    assert r.returncode == 1, r
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    assert "--port" in r.stderr  # the way out
    assert "collector on http" not in r.stdout and "startup complete" not in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("kind", ["directory", "yaml", "missing"])
def test_serve_with_a_bad_rules_file_says_so_before_its_banner(tmp_path: Path,
                                                                kind: str) -> None:
    """A bad ``LOGITWATCH_ALERT_RULES`` used to print the banner, then a 40-line traceback
    from inside the app factory."""
    from click.testing import CliRunner

    path = {"directory": tmp_path, "yaml": tmp_path / "bad.yaml",
            "missing": tmp_path / "nope.yaml"}[kind]
    if kind == "yaml":
        path.write_text("rules: [\n")
    r = CliRunner().invoke(main, ["serve", "--port", "0", "--db",
                                  f"sqlite:///{tmp_path / 'c.db'}"],
                           env={"LOGITWATCH_ALERT_RULES": str(path)})
    assert r.exit_code == 1, r.output
    assert "LOGITWATCH_ALERT_RULES" in r.output and str(path) in r.output
    assert "collector on" not in r.output and "Traceback" not in r.output


def test_a_store_that_cannot_be_opened_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    from click.testing import CliRunner

    runner = CliRunner()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = runner.invoke(main, ["runs", "list", "--db",
                             f"postgresql+psycopg://u:p@127.0.0.1:{port}/db"])
    assert r.exit_code == 1 and "is the database server running" in r.output, r.output
    assert "Traceback" not in r.output and ":p@" not in r.output  # no password shown
    home = tmp_path / "a-file"
    home.write_text("")
    r = runner.invoke(main, ["serve", "--port", "0"], env={"LOGITWATCH_HOME": str(home),
                                                           "LOGITWATCH_DB_URL": None})
    assert r.exit_code == 1 and "cannot be created" in r.output, r.output
    assert "LOGITWATCH_HOME" in r.output and "Traceback" not in r.output


def test_a_bad_setting_names_its_variable_or_option() -> None:
    """pydantic's own text named the field and linked its docs; the person must find the
    ``LOGITWATCH_*`` variable or the option."""
    from click.testing import CliRunner

    runner = CliRunner()
    r = runner.invoke(main, ["serve", "--port", "0"],
                      env={"LOGITWATCH_MAX_REQUEST_BYTES": "abc"})
    assert r.exit_code == 1 and "LOGITWATCH_MAX_REQUEST_BYTES: " in r.output, r.output
    assert "'abc'" in r.output and "pydantic.dev" not in r.output
    r = runner.invoke(main, ["runs", "list", "--db", "notadb"])
    assert r.exit_code == 1 and "--db / LOGITWATCH_DB_URL: " in r.output, r.output
    assert "pydantic.dev" not in r.output
    # a webhook that can never be delivered to is refused at startup, not at the first alert
    for bad in ("notaurl", "ftp://example.org/hook", "http://"):
        r = runner.invoke(main, ["serve", "--port", "0", "--webhook", bad])
        assert r.exit_code == 1 and "--webhook / LOGITWATCH_WEBHOOK_URL: " in r.output, r.output
        assert "collector on" not in r.output


def test_serve_warns_of_a_misspelt_variable(tmp_path: Path) -> None:
    """``LOGITWATCH_REQUIRE_TOKEN`` (no S) left the collector open without a word."""
    from click.testing import CliRunner

    home = tmp_path / "a-file"  # the store then fails: serve stops after its warnings
    home.write_text("")
    r = CliRunner().invoke(main, ["serve", "--port", "0"],
                           env={"LOGITWATCH_HOME": str(home), "LOGITWATCH_DB_URL": None,
                                "LOGITWATCH_REQUIRE_TOKEN": "1", "LOGITWATCH_TOKEN": "x"})
    assert ("LOGITWATCH_REQUIRE_TOKEN is not a logitwatch setting and is ignored (did you "
            "mean LOGITWATCH_REQUIRE_TOKENS?)") in r.output, r.output
    assert "LOGITWATCH_TOKEN is not" not in r.output  # the client's, and push's


def test_token_list_does_not_create_a_store(tmp_path: Path) -> None:
    from click.testing import CliRunner

    home = tmp_path / "home"
    r = CliRunner().invoke(main, ["token", "list"], env={"LOGITWATCH_HOME": str(home),
                                                         "LOGITWATCH_DB_URL": None})
    assert r.exit_code == 0 and "no tokens: no store" in r.output, r.output
    assert not home.exists()


def _options(cmd: click.Command, path: str = "logitwatch") -> list[tuple[str, click.Option]]:
    out = [(path, p) for p in cmd.params if isinstance(p, click.Option)]
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            out += _options(sub, f"{path} {name}")
    return out


def test_every_option_says_what_it_does() -> None:
    missing = [f"{path} {opt.opts[0]}" for path, opt in _options(main)
               if not (opt.help or "").strip() and opt.name not in ("help", "version")]
    assert not missing, f"options without help text: {missing}"
    serve = main.commands["serve"]
    port = next(p for p in serve.params if p.name == "port")
    assert "port" in (port.help or "").lower()


# --- push --------------------------------------------------------------------------------


def spool_some(tmp_path: Path, run: str = "pushed", n: int = 5) -> Path:
    """A spool with ``n`` frames (and the end frame) a job could not deliver."""
    spool = tmp_path / "spool"
    dead = f"http://127.0.0.1:{free_port()}"
    client = Client(dead, run=run, config=ClientConfig(
        spool_dir=str(spool), interval=0.05, max_backoff=0.2, spool_interval=0.05))
    for step in range(n):
        client.send(step, {"loss": 1.0 + step}, {})
    client.shutdown(0.5)
    assert client.stats["spooled"] == n + 1
    return spool


def test_push_tells_a_collector_that_is_down(tmp_path: Path) -> None:
    spool = spool_some(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    r = lw("push", str(spool), "--url", url, "--attempts", "1")
    assert r.returncode == 1
    assert f"no collector answers at {url}/api/v1/ingest" in r.stderr
    assert "it is down or the host or port is wrong" in r.stderr
    assert "6 frame(s) are still in" in r.stderr


def test_push_tells_a_wrong_path_on_a_collector_that_is_up(tmp_path: Path) -> None:
    spool = spool_some(tmp_path)
    # --log-level info: the collector's access log lists every request it answered
    with Served(tmp_path, "--db", f"sqlite:///{tmp_path / 'c.db'}",
                "--log-level", "info") as col:
        wrong = lw("push", str(spool), "--url", f"{col.url}/collector")
        assert wrong.returncode == 1
        assert f"{col.url}/collector/api/v1/ingest answered HTTP 404" in wrong.stderr
        assert "not a logitwatch collector's ingest path" in wrong.stderr
        assert "no collector answers" not in wrong.stderr and "when it is up" not in (
            wrong.stderr)
        posts = [line for line in col.log.read_text().splitlines()
                 if "POST /collector/api/v1/ingest" in line]
        assert len(posts) == 1, f"a 404 is not retried: {posts}"

        # The API path appended by mistake: taken as the base URL, and said so.
        done = lw("push", str(spool), "--url", f"{col.url}/api/v1")
        assert done.returncode == 0, done.stderr
        assert f"--url {col.url}/api/v1 taken as {col.url}" in done.stderr
        assert "sent 6 frame(s): 6 stored" in done.stdout
        # No stray progress label when stderr is not a terminal.
        assert "frames" not in done.stderr.splitlines()
        assert [x.strip() for x in done.stderr.splitlines() if x.strip() == "frames"] == []
        steps = httpx.get(f"{col.url}/api/v1/runs/pushed/series", params={"name": "loss"},
                          timeout=10).json()["steps"]
        assert steps == [0, 1, 2, 3, 4]


# --- the collector URL a job passes ----------------------------------------------------------


@pytest.mark.parametrize(("given", "base"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("localhost:8000/api/v1", "http://localhost:8000"),
    ("https://lw.example.com/team/api/v1/ingest/", "https://lw.example.com/team"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_slips_in_the_url_are_corrected_with_a_warning(
        given: str, base: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        assert normalize_url(given) == base
    warned = [r.getMessage() for r in caplog.records]
    if given.rstrip("/") == base:
        assert not warned
    else:
        assert len(warned) == 1 and f"taken as {base!r}" in warned[0]


@pytest.mark.parametrize(("given", "why"), [
    ("", "non-empty string"),
    ("ftp://host:8000", "scheme must be http or https"),
    ("http://", "names no host"),
    ("http://host:port", "port is not a number"),
    ("http://host:8000/?token=x", "no query or fragment"),
    ("http://my host:8000", "contains spaces"),
])
def test_a_url_that_cannot_be_a_collector_fails_at_attach_time(given: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Client(given, run="r")


def test_attach_with_the_api_path_appended_still_delivers(tmp_path: Path,
                                                          one_torch_thread: None) -> None:
    import torch

    import logitwatch

    with Served(tmp_path, "--db", f"sqlite:///{tmp_path / 'c.db'}") as col:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = logitwatch.attach(model, opt, run="slipped", url=col.url + "/api/v1",
                                sample_every=1)
        assert mon.client.url == col.url
        for _ in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
        mon.close()
        run = httpx.get(f"{col.url}/api/v1/runs/slipped", timeout=10).json()
    assert run["status"] == "finished" and run["last_step"] == 2


def test_a_job_sending_to_a_wrong_path_is_told_what_to_fix(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The job's one delivery warning says the URL is not a collector's base URL, where a
    collector that is down only says it cannot deliver."""
    with Served(tmp_path, "--db", f"sqlite:///{tmp_path / 'c.db'}") as col:
        client = Client(f"{col.url}/collector", run="lost", config=ClientConfig(
            spool_dir=str(tmp_path / "spool"), interval=0.05, max_backoff=0.2))
        with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
            client.send(0, {"loss": 1.0}, {})
            deadline = time.monotonic() + 20
            while "cannot deliver" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            client.shutdown(0.2)
    (line,) = [r.getMessage() for r in caplog.records if "cannot deliver" in r.getMessage()]
    assert "HTTP 404" in line and "not a logitwatch collector's ingest path" in line
    assert "http://127.0.0.1:8000" in line  # what a base URL looks like
