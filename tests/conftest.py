"""Shared fixtures: a fresh database per test, on SQLite and (when available) PostgreSQL;
the hostile-day tests' collectors and clients; a collector that records what the hooks send.

PostgreSQL comes from ``LOGITWATCH_TEST_PG_URL`` (scripts/test.sh starts a throwaway
cluster and sets it). With ``LOGITWATCH_REQUIRE_PG=1`` a missing server fails the tests
instead of skipping them, so CI cannot pass without PostgreSQL.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.client import Client, ClientConfig
from logitwatch.server.app import create_app
from tests.client_collector import FAST, Collector
from tests.hostile import settings
from tests.pg import pg_database
from tests.served import Served

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Starlette's TestClient names its fake server "testserver" in the Host header, and some
# tests forward a client's requests for "http://collector" to it; a collector answers only
# to its own names (server/guards.py), so the tests add those two.
os.environ.setdefault("LOGITWATCH_ALLOWED_HOSTS", "testserver,collector")
# logitwatch's home (the default store, and the spool) is never the real one in the tests:
# a temporary one for the whole session (module fixtures, subprocesses), and one per test
# below (the ``logitwatch_home`` fixture).
os.environ["LOGITWATCH_HOME"] = tempfile.mkdtemp(prefix="logitwatch-test-home-")
atexit.register(shutil.rmtree, os.environ["LOGITWATCH_HOME"], ignore_errors=True)

@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, then a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'lw.db'}"
    else:
        yield from pg_database()


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """A migrated database at ``db_url`` (SQLite, and PostgreSQL where configured) and a
    session factory for it."""
    from logitwatch.server.db.session import make_engine, migrate

    engine = make_engine(db_url)
    migrate(engine)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


@pytest.fixture(autouse=True)
def logitwatch_home(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own logitwatch home (``LOGITWATCH_HOME``): the default store and spool
    of the commands, collectors and clients it starts, never the user's."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("LOGITWATCH_HOME", str(home))
    return home


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lw.db'}"


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]


# Named ``chromium`` (not ``browser``) to stay clear of pytest-playwright's fixtures.
@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Debian's headless Chromium driven by Playwright. Skipped when absent, unless
    ``LOGITWATCH_REQUIRE_BROWSER`` is set (scripts/test.sh sets it), which fails instead."""
    if not CHROMIUM.exists():
        if os.environ.get("LOGITWATCH_REQUIRE_BROWSER"):
            pytest.fail("LOGITWATCH_REQUIRE_BROWSER is set but /usr/bin/chromium is missing")
        pytest.skip("needs Debian's Chromium at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                              args=CHROMIUM_ARGS)
        yield b
        b.close()


def _run_gloo_pair(tmp_path: Path, source: str, argv: Callable[[int], list[str]],
                   env: dict[str, str] | None = None, timeout: float = 120,
                   world: int = 2) -> None:
    """Run ``source`` as ``world`` (two) real processes, ranks of a gloo group on loopback.

    ``argv(rank)`` gives each worker's arguments. Both workers are always reaped (killed at
    ``timeout``: a hang fails the test instead of stalling the run); a non-zero exit fails it
    with the worker's output.
    """
    from logitwatch.demo.runner import free_port

    script = tmp_path / "worker.py"
    script.write_text(source)
    port = free_port()
    procs = []
    for rank in range(world):
        worker_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                      "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "PATH": "/usr/bin:/bin",
                      "HOME": str(tmp_path), "PYTHONWARNINGS": "ignore", **(env or {})}
        procs.append(subprocess.Popen([sys.executable, str(script), *argv(rank)],
                                      env=worker_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out.decode()[-3000:]


@pytest.fixture
def gloo_pair() -> Callable[..., None]:
    """:func:`_run_gloo_pair`: two real worker processes in one gloo group."""
    return _run_gloo_pair


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models: one intra-op thread is faster and immune to a busy 2-core CI box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def rising_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn attn_logit_rising on (off by default) through a rules file, for the tests whose
    subject is an alert that a head leaving its early range fires (ingest answers, the
    dashboard's live alert cards, restarts)."""
    path = tmp_path / "rising-rule.yaml"
    path.write_text("rules:\n  - {name: attn_logit_rising, kind: departure, "
                    "metric: attn.logit_max, severity: info, for_steps: 20, for_samples: 3,\n"
                    "     params: {factor: 4.0, floor: 30.0, window: 200, lag: 50}}\n")
    monkeypatch.setenv("LOGITWATCH_ALERT_RULES", str(path))


# --- the hostile-day tests' collectors and clients (test_hostile_*.py) ---------------------


@pytest.fixture
def app_client(sqlite_url: str) -> Iterator[TestClient]:
    """The collector's whole ASGI stack on a fresh SQLite database (no token cache, a fast
    live stream)."""
    with TestClient(create_app(settings(sqlite_url))) as c:
        yield c


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(db_url=None, *args, nofile=None, port=None, **env)`` starts ``logitwatch
    serve`` on loopback (a fresh SQLite database by default); each is stopped after the
    test."""
    made: list[Served] = []

    def start(db_url: str | None = None, *args: str, nofile: int | None = None,
              port: int | None = None, **env: str) -> Served:
        s = Served(tmp_path, "--db", db_url or f"sqlite:///{tmp_path / 'served.db'}", *args,
                   nofile=nofile, port=port, env=env)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


@pytest.fixture
def client_for(tmp_path: Path) -> Iterator[Callable[..., Client]]:
    """``client_for(url, run, **config)``: a real client with short timings and a spool
    under the test's directory; each is shut down after the test."""
    made: list[Client] = []

    def make(url: str, run: str, **config: Any) -> Client:
        cfg = {"interval": 0.05, "max_backoff": 0.1, "spool_interval": 0.1, "timeout": 5.0,
               "spool_dir": str(tmp_path / "spool"), **config}
        c = Client(url, run=run, config=ClientConfig(**cfg))
        made.append(c)
        return c

    yield make
    for c in made:
        c.shutdown(5.0)


# --- the hooks' tests: a collector that records what it is sent -----------------------------


class Recorder:
    """A collector (an httpx MockTransport handler) that keeps every frame posted to it and
    answers with ``control``."""

    def __init__(self) -> None:
        self.frames: list[dict] = []
        self.control: dict = {}
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        with self.lock:
            self.frames.extend(json.loads(body)["frames"])
        return httpx.Response(200, json={"alerts": [], "control": self.control})


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, Client]]:
    """A :class:`Recorder` and a real client posting to it (the hooks' tests)."""
    rec = Recorder()
    http = httpx.Client(transport=httpx.MockTransport(rec))
    client = Client("http://collector", run="r", config=ClientConfig(interval=0.02), http=http)
    yield rec, client
    client.shutdown(5.0)


@pytest.fixture
def make_client() -> Iterator[Callable[..., Client]]:
    """Clients on a scripted collector (``tests/client_collector.Collector``), shut down
    after the test (any stuck reply released first)."""
    clients: list[Client] = []
    releases: list[threading.Event] = []

    def make(collector: Collector, *, config: ClientConfig = FAST,
             release: threading.Event | None = None) -> Client:
        if release is not None:
            releases.append(release)
        http = httpx.Client(transport=httpx.MockTransport(collector))
        client = Client("http://collector", run="r1", config=config, http=http)
        clients.append(client)
        return client

    yield make
    for event in releases:
        event.set()
    for client in clients:
        client.shutdown(5.0)
