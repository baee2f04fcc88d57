"""The dashboard in headless Chromium: hostile names render as text, and logins isolate.

1. Escaping. Ingest refuses names outside ``[A-Za-z0-9._:-]`` (test_security.py), so the
   hostile strings are written straight into the store, as a database shared with another
   tool, or written by an older version, could hold them: run and project names, alert rule,
   metric, message and remedies. Both pages, the alert panel and Plotly's hover labels must
   show them literally, and nothing may execute.
2. Login. With tokens, the pages ask for a read token; a wrong one is refused with the
   collector's message, a read token of one project shows that project's runs only (the
   other's run page says "not found"), and the live stream runs on the session cookie.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from logitwatch.demo.runner import Collector as LiveCollector
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.store.tokens import create_token

pytestmark = pytest.mark.browser

WAIT_MS = 10_000

PWN = "window.__pwned=1"
HOSTILE_RUN = f"<script>{PWN}</script>"
HOSTILE_PROJECT = f'"><img src=x onerror="{PWN}">'
HOSTILE_MESSAGE = f"</p><img src=x onerror={PWN}> '\"><script>{PWN}</script> & %{{x}}"
HOSTILE_METRIC = f"<img src=x onerror={PWN}>%{{y}}"
HOSTILE_RULE = f"<b onmouseover={PWN}>rule</b>"
HOSTILE_REMEDY = f'<a href="javascript:{PWN}">click</a>'


@pytest.fixture
def tab(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    yield page
    context.close()


class Collector(LiveCollector):
    """uvicorn on a free loopback port, in a thread."""

    def __init__(self, db_url: str) -> None:
        super().__init__(db_url, stream_interval=0.2, auth_cache_seconds=0)
        self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)


@pytest.fixture
def db_file(tmp_path: Path, rising_rule: None) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    yield url


def frames(run: str, project: str, seqs: range, climb_from: int = 10) -> list[dict[str, Any]]:
    out = []
    for i in seqs:
        m = [[5.0, 5.1], [5.2, 5.3]]
        if i >= climb_from:
            m[1][1] = 40.0 + 5.0 * (i - climb_from)
        out.append({"run": run, "project": project, "seq": i, "step": i * 10,
                    "time": time.time(), "heads": {"attn.logit_max": m},
                    "scalars": {"loss": 3.0 * math.exp(-i / 20) + 0.5, "grad.norm": 1.0}})
    return out


def post(url: str, batch: list[dict[str, Any]], token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"{url}/api/v1/ingest", json={"frames": batch}, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def assert_nothing_ran(page: Any) -> None:
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("[...document.scripts].every(s => s.src)"), "an inline script appeared"


def test_hostile_names_render_literally(db_file: str, tab: Any) -> None:
    server = Collector(db_file)
    try:
        answer = post(server.url, frames("victim", "p", range(16)))
        assert answer["alerts"], "the seeded run should have fired an alert"
        engine = make_engine(db_file)
        with engine.begin() as c:
            c.execute(update(Run).values(name=HOSTILE_RUN, project=HOSTILE_PROJECT))
            c.execute(update(Alert).values(rule=HOSTILE_RULE, metric=HOSTILE_METRIC,
                                           message=HOSTILE_MESSAGE, remedies=[HOSTILE_REMEDY]))
        engine.dispose()
        page = tab

        page.goto(f"{server.url}/")
        page.wait_for_selector("tr[data-run-id='1']", timeout=WAIT_MS)
        row = page.locator("tr[data-run-id='1']")
        assert row.locator("td.name a").inner_text() == HOSTILE_RUN
        assert row.locator("td").nth(1).inner_text() == HOSTILE_PROJECT
        assert_nothing_ran(page)

        page.goto(f"{server.url}/runs/1")
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
        assert page.locator("#run-name").inner_text() == HOSTILE_RUN
        assert page.locator("#run-project").inner_text() == HOSTILE_PROJECT
        assert page.title().startswith(HOSTILE_RUN)
        card = page.locator("#alerts .alert").first
        assert card.locator(".message").inner_text() == HOSTILE_MESSAGE
        assert HOSTILE_METRIC in card.locator(".when.fired .facts").inner_text()
        card.locator(".remedies summary").click()
        assert card.locator(".remedies li").inner_text() == HOSTILE_REMEDY
        assert card.locator("a").count() == 0

        # Plotly renders a subset of HTML in hover labels: hover the alert marker and read
        # what is drawn.
        page.evaluate("""() => {
            const gd = document.getElementById('loss');
            const i = gd.data.findIndex(t => t.meta === 'alerts-other');  // not the loss's
            Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: 0}]);
        }""")
        page.wait_for_selector("#loss .hoverlayer .hovertext", timeout=WAIT_MS)
        hover = page.evaluate("document.querySelector('#loss .hoverlayer').textContent")
        assert HOSTILE_RULE in hover and HOSTILE_METRIC in hover, hover
        assert_nothing_ran(page)
        page.wait_for_function("document.getElementById('stream').textContent === 'live'",
                               timeout=WAIT_MS)
        assert_nothing_ran(page)
        assert page.errors == []
    finally:
        server.stop()


def test_login_isolates_projects_and_streams_on_the_cookie(db_file: str, tab: Any) -> None:
    engine = make_engine(db_file)
    with session_scope(sessionmaker(engine)) as s:
        ingest_a = create_token(s, project="alpha", scope="ingest").secret
        ingest_b = create_token(s, project="beta", scope="ingest").secret
        read_a = create_token(s, project="alpha", scope="read").secret
    engine.dispose()
    server = Collector(db_file)
    try:
        post(server.url, frames("a-run", "alpha", range(5)), ingest_a)
        post(server.url, frames("b-secret", "beta", range(5)), ingest_b)
        page = tab

        page.goto(f"{server.url}/")
        page.wait_for_selector("#login", timeout=WAIT_MS)
        assert page.locator("#runs-table").is_hidden()
        page.fill("#login-token", ingest_a)  # not a read token
        page.click("#login button")
        page.wait_for_selector("#login-error:text('read token')", timeout=WAIT_MS)
        page.fill("#login-token", read_a)
        page.click("#login button")
        page.wait_for_selector("tr[data-run-id]", timeout=WAIT_MS)
        names = page.locator("td.name a").all_inner_texts()
        assert names == ["a-run"] and "b-secret" not in page.content()
        assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it

        page.goto(f"{server.url}/runs/2")  # beta's run
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
        assert page.locator("#run-name").inner_text() == "run 2 not found"

        page.goto(f"{server.url}/runs/1")
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
        assert page.locator("#run-name").inner_text() == "a-run"
        page.wait_for_function("document.getElementById('stream').textContent === 'live'",
                               timeout=WAIT_MS)
        post(server.url, frames("a-run", "alpha", range(5, 8)), ingest_a)
        page.wait_for_function("document.getElementById('loss').data[0].x.length === 8",
                               timeout=WAIT_MS)
        assert page.errors == []
    finally:
        server.stop()
