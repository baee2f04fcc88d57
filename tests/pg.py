"""A throwaway PostgreSQL database per test, on the server ``LOGITWATCH_TEST_PG_URL`` names
(scripts/test.sh starts one): for ``conftest.py``'s ``db_url`` and the tests that need
PostgreSQL alone. Not a test module."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_URL = os.environ.get("LOGITWATCH_TEST_PG_URL")


def pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database on ``LOGITWATCH_TEST_PG_URL``'s server, dropped
    afterwards (yielded as a URL); skips the test without a server, fails it when
    ``LOGITWATCH_REQUIRE_PG`` is set."""
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
