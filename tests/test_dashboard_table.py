"""The runs page's table in headless Chromium: start time, duration, verdict, tags and the
configuration a job sent (PUT /api/v1/runs/{run}/config), sorted by a click on a header
(kept in the address), filtered by the filter box (name, project, tag or configuration);
at 390x844 the table scrolls inside its box and the page itself does not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Run
from logitwatch.server.db.session import make_engine
from logitwatch.server.store import queries
from tests.dashboard_tools import WAIT_MS, Collector, ingest

pytestmark = pytest.mark.browser

# name: (started this many seconds ago, steps, last loss, tags, config)
RUNS: dict[str, tuple[int, int, float | str, list[str], dict[str, Any] | None]] = {
    "short-run": (120, 5, 1.0, ["baseline"], {"lr": 0.001, "model": "gpt2-small", "batch": 16}),
    "long-run": (7300, 30, 0.5, ["sweep", "lr-high"], {"lr": 0.01, "model": "llama-tiny"}),
    "nan-run": (600, 12, "NaN", [], None),
}


def frames(name: str, steps: int, last: float | str, ago: float = 0.0) -> list[dict[str, Any]]:
    """``steps`` frames stamped evenly from ``ago`` seconds before now to now."""
    now = time.time()
    return [{"run": name, "project": "table", "seq": i, "step": i * 10,
             "time": now - ago + i * ago / max(1, steps - 1),
             "scalars": {"loss": last if i == steps - 1 else 2.0}} for i in range(steps)]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("db") / "x.db"
    c = Collector(db)
    for name, (ago, steps, last, _, _) in RUNS.items():
        ingest(c.url, frames(name, steps, last, ago))
    runs = {r["name"]: r["id"] for r in httpx.get(f"{c.url}/api/v1/runs").json()}
    engine = make_engine(f"sqlite:///{db}")
    with Session(engine) as s, s.begin():
        for name, (ago, _, _, tags, _) in RUNS.items():
            s.execute(update(Run).where(Run.id == runs[name])
                      .values(created_at=time.time() - ago))
            queries.set_tags(s, runs[name], add=tags)
    engine.dispose()
    for name, (_, _, _, _, config) in RUNS.items():
        if config is not None:
            r = httpx.put(f"{c.url}/api/v1/runs/{runs[name]}/config", json=config)
            assert r.status_code == 200 and r.json() == config, r.text
    yield c.url
    c.stop()


def names(page: Any) -> list[str]:
    return page.eval_on_selector_all("#runs-table tbody tr td.name a",
                                     "as => as.map(a => a.textContent)")


def open_runs(chromium: Any, url: str, width: int, height: int) -> Any:
    page = chromium.new_page(viewport={"width": width, "height": height})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 3",
                           timeout=WAIT_MS)
    return page


def test_config_api(seeded: str) -> None:
    runs = httpx.get(f"{seeded}/api/v1/runs").json()
    by = {r["name"]: r for r in runs}
    assert by["short-run"]["config"] == RUNS["short-run"][4] and by["nan-run"]["config"] is None
    rid = by["nan-run"]["id"]
    assert httpx.put(f"{seeded}/api/v1/runs/{rid}/config", json=[1, 2]).status_code == 422
    big = {f"k{i}": i for i in range(300)}
    r = httpx.put(f"{seeded}/api/v1/runs/{rid}/config", json=big)
    assert r.status_code == 422 and r.json()["code"] == "config-too-large"
    assert httpx.put(f"{seeded}/api/v1/runs/999/config", json={}).status_code == 404


def test_runs_table_columns_sort_and_filter(seeded: str, chromium: Any) -> None:
    page = open_runs(chromium, seeded, 1440, 900)
    heads = page.eval_on_selector_all("#runs-table thead th", "ths => ths.map(t => t.dataset.col)")
    assert heads == ["name", "project", "status", "verdict", "loss", "started", "duration",
                     "step", "seen", "alerts", "tags", "config"]
    row = page.locator("#runs-table tbody tr", has_text="long-run")
    assert row.locator("td[data-col='duration']").inner_text().startswith("2 h")
    assert row.locator("td[data-col='tags'] .chip").all_inner_texts() == ["lr-high", "sweep"]
    assert "model=llama-tiny" in row.locator("td[data-col='config']").inner_text()
    assert row.locator("td[data-col='verdict']").inner_text().lower() == "healthy"
    nan = page.locator("#runs-table tbody tr", has_text="nan-run")
    assert nan.get_attribute("data-status") == "diverged"
    assert nan.locator("td[data-col='verdict']").inner_text().lower() == "diverged"

    # A click sorts by the column (the longest first), a second click the other way.
    page.click("#runs-table th[data-col='duration'] button")
    assert names(page) == ["long-run", "nan-run", "short-run"]
    assert page.get_attribute("th[data-col='duration']", "aria-sort") == "descending"
    page.click("#runs-table th[data-col='duration'] button")
    assert names(page) == ["short-run", "nan-run", "long-run"]
    assert "sort=duration-asc" in page.url
    page.click("#runs-table th[data-col='name'] button")
    assert names(page) == ["long-run", "nan-run", "short-run"]
    # The sort survives the page's refresh and a reload from the address.
    n = int(page.evaluate("document.body.dataset.refreshes"))
    page.wait_for_function(f"Number(document.body.dataset.refreshes) > {n}", timeout=WAIT_MS)
    assert names(page) == ["long-run", "nan-run", "short-run"]
    page.goto(page.url)
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 3",
                           timeout=WAIT_MS)
    assert names(page) == ["long-run", "nan-run", "short-run"]

    # The filter box finds runs by their configuration and by their tags.
    page.fill("#f-q", "gpt2-small")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 1",
                           timeout=WAIT_MS)
    assert names(page) == ["short-run"]
    page.fill("#f-q", "sweep")
    page.wait_for_function("document.querySelector('#runs-table tbody td.name a')"
                           "?.textContent === 'long-run'", timeout=WAIT_MS)
    assert page.errors == []
    page.close()


def test_runs_table_on_a_phone(seeded: str, chromium: Any) -> None:
    page = open_runs(chromium, seeded, 390, 844)
    # The table scrolls in its box; the page does not scroll sideways.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator(".table-scroll")
    assert box.evaluate("b => b.scrollWidth > b.clientWidth")
    first = page.locator("#runs-table tbody tr").first
    for sel in ("td.name a", "td[data-col='project']"):
        b = first.locator(sel).bounding_box()
        assert b and 0 <= b["x"] and b["x"] + b["width"] <= 390 and b["y"] + b["height"] <= 844
    # Sorting works here too (the newest first).
    page.click("#runs-table th[data-col='started'] button")
    page.wait_for_function("new URL(location.href).searchParams.get('sort') === 'started-desc'",
                           timeout=WAIT_MS)
    assert names(page) == ["short-run", "nan-run", "long-run"]
    assert page.errors == []
    page.close()


def test_a_job_clock_behind_is_seen_now(tmp_path: Path, chromium: Any) -> None:
    """A job whose clock runs two hours behind the collector's: its row says it was seen
    seconds ago, by the collector's clock (not two hours ago), and ran 90 s, by the job's
    (not 0 s); the run page's dot says it is reporting (not quiet for two hours)."""
    c = Collector(tmp_path / "skew.db")
    try:
        behind = [{**f, "time": f["time"] - 7200} for f in frames("behind", 3, 1.0, ago=90)]
        ingest(c.url, behind)
        page = chromium.new_page(viewport={"width": 1440, "height": 900})
        page.goto(c.url)
        page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 1",
                               timeout=WAIT_MS)
        row = page.locator("#runs-table tbody tr", has_text="behind")
        assert row.locator("td[data-col='seen']").inner_text().endswith(" s ago")
        # how long it ran, by its own clock: 90 s between its first and last frames
        assert row.locator("td[data-col='duration']").inner_text() == "1 min 30 s"
        row.locator("td.name a").click()
        page.wait_for_function("document.getElementById('conn')?.dataset.state === 'live'",
                               timeout=WAIT_MS)
        assert "reporting" in page.inner_text("#conn")
        page.close()
    finally:
        c.stop()


def test_a_name_of_the_longest_kind_wraps_in_its_column(tmp_path: Path, chromium: Any) -> None:
    """A run name of 128 characters without a space (the longest the collector takes) wraps
    inside the name column: at 1920 px the table fits the window and its last column shows
    without scrolling."""
    c = Collector(tmp_path / "long.db")
    try:
        ingest(c.url, frames("r" * 128, 3, 1.0, ago=60))
        page = chromium.new_page(viewport={"width": 1920, "height": 900})
        page.goto(c.url)
        page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 1",
                               timeout=WAIT_MS)
        table = page.eval_on_selector("#runs-table", "t => t.getBoundingClientRect().width")
        assert table <= 1920, table
        last = page.eval_on_selector("#runs-table thead th:last-child",
                                     "t => t.getBoundingClientRect().right")
        assert last <= 1920, last
        page.close()
    finally:
        c.stop()
