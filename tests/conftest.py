"""Shared fixtures: a fresh database per test, on SQLite and (when available) PostgreSQL.

PostgreSQL comes from ``LOGITWATCH_TEST_PG_URL`` (scripts/test.sh starts a throwaway
cluster and sets it). With ``LOGITWATCH_REQUIRE_PG=1`` a missing server fails the tests
instead of skipping them, so CI cannot pass without PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PG_URL = os.environ.get("LOGITWATCH_TEST_PG_URL")


def _pg_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    if not PG_URL:
        if os.environ.get("LOGITWATCH_REQUIRE_PG"):
            pytest.fail("LOGITWATCH_REQUIRE_PG is set but LOGITWATCH_TEST_PG_URL is not")
        pytest.skip("PostgreSQL not configured (set LOGITWATCH_TEST_PG_URL; scripts/test.sh does)")
    name = f"lw_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, then a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'lw.db'}"
    else:
        yield from _pg_database()


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
