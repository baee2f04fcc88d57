"""The dashboard's verdicts say what is true (UI audit): a run that finished with a critical
alert still open is not green and sorts with the runs that need attention; a run without
attention statistics does not claim healthy logits; an alert's hover label names every
head; the runs list and the run page agree on a non-finite last loss whatever rules are
enabled; a comparison draws the runs that exist and names the missing ids; "1 step",
"1 consequence". Reproductions as /tmp/uiaudit/feed.py posts them (gradnan, noattn,
nanquiet)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.figures.marks import alert_label
from logitwatch.server.schemas import AlertOut, RunOut
from logitwatch.server.settings import Settings
from logitwatch.server.store.incidents import verdict
from tests.dashboard_tools import WAIT_MS, Collector, ingest

PROJECT = "verdicts"


def frames(name: str, n: int, loss: Any, *, grad: Any = None, heads: bool = True,
           end: bool = False, t0: float | None = None) -> list[dict[str, Any]]:
    """``n`` steps of ``name``: loss(s), grad.norm grad(s) (0.5), lr; attention logits every
    10 steps unless ``heads`` is false; an end frame when ``end``."""
    t0 = time.time() - n * 0.01 if t0 is None else t0
    out: list[dict[str, Any]] = []
    for s in range(n):
        f: dict[str, Any] = {
            "run": name, "project": PROJECT, "rank": 0, "seq": s + 1, "step": s,
            "time": t0 + s * 0.01,
            "scalars": {"loss": loss(s), "grad.norm": grad(s) if grad else 0.5, "lr": 1e-3}}
        if heads and s % 10 == 0:
            f["heads"] = {"attn.logit_max": [[3.0 + 0.1 * la + 0.01 * h for h in range(4)]
                                             for la in range(2)]}
        out.append(f)
    if end:
        out.append({"run": name, "project": PROJECT, "rank": 0, "seq": n + 1, "step": n - 1,
                    "time": t0 + n * 0.01, "end": "finished"})
    return out


def gradnan() -> list[dict[str, Any]]:
    """feed.py gradnan: grad.norm NaN from step 250 to 399, then the job ends."""
    return frames("finish-gradnan", 400, lambda s: 5 * math.exp(-s / 200) + 2 + 0.001 * (s % 7),
                  grad=lambda s: "NaN" if s >= 250 else 0.5, end=True)


def nanquiet() -> list[dict[str, Any]]:
    """feed.py nanquiet: the loss NaN from step 250 (with loss_nonfinite disabled)."""
    return frames("nan-rule-off", 300, lambda s: "NaN" if s >= 250 else 3 + 0.001 * (s % 5))


def disable_loss_nonfinite(put: Any, get: Any) -> None:
    rules = {r["name"]: r for r in get("/api/v1/alerts/rules")}
    body = {k: v for k, v in rules["loss_nonfinite"].items() if k != "name"}
    r = put("/api/v1/alerts/rules/loss_nonfinite", {**body, "enabled": False})
    assert r.status_code == 200, r.text


# --- API: verdicts, labels -----------------------------------------------------------------


def alert(id: int, fired: int, *, rule: str = "grad_nonfinite", metric: str = "grad.norm",
          severity: str = "critical", state: str = "firing", layer: int | None = None,
          head: int | None = None, heads: list[int] | None = None) -> AlertOut:
    return AlertOut(
        id=id, run_id=1, run="r", project="p", rule=rule, metric=metric, severity=severity,
        state=state, rank=0, layer=layer, head=head, heads=heads, started_step=fired,
        fired_step=fired, fired_at=0.0, paged_step=fired if severity != "info" else None,
        resolved_step=None, value=1.0, baseline=1.0, threshold=1.0, message="m", evidence={},
        remedies=[])


def run(**kw: Any) -> RunOut:
    base = {"id": 1, "project": "p", "name": "r", "created_at": 0.0, "last_step": 399,
            "last_time": 1.0, "open_alerts": 1}
    return RunOut(**{**base, **kw})


def test_finished_with_a_paging_alert_open_is_not_green() -> None:
    done = run(status="finished", end_step=399)
    v = verdict(done, [alert(1, 250)])
    assert v.kind == "finished_alerting"
    assert v.text == "finished at step 399 with a critical alert open: grad_nonfinite"
    w = verdict(done, [alert(1, 250, rule="grad_spike", severity="warning")])
    assert w.kind == "finished_alerting" and "with a warning alert open: grad_spike" in w.text
    # only info open: finished, green
    assert verdict(done, [alert(1, 250, severity="info")]).kind == "finished"
    assert verdict(done, [alert(1, 250, state="resolved")]).kind == "finished"
    assert verdict(done, []).text == "finished at step 399"


def test_finished_gradnan_run_reads_alerting_on_page_list_and_inbox(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        ingest_ok = c.post("/api/v1/ingest", json={"frames": gradnan()})
        assert ingest_ok.status_code == 200, ingest_ok.text
        page = c.get("/api/v1/dashboard/runs/1").json()
        assert page["run"]["status"] == "finished"
        v = page["verdict"]
        assert v["kind"] == "finished_alerting", v
        assert v["text"].startswith("finished at step 399 with ")
        assert "critical: grad_nonfinite" in v["text"] or v["text"].endswith(
            "a critical alert open: grad_nonfinite"), v
        [row] = c.get("/api/v1/dashboard/runs").json()
        assert (row["status"], row["verdict"], row["verdict_text"]) == (
            "finished", "finished_alerting", v["text"])
        # the status filter still reads the run's status
        assert [r["name"] for r in c.get("/api/v1/dashboard/runs",
                                         params={"status": "finished"}).json()] == [
            "finish-gradnan"]
        [entry] = c.get("/api/v1/dashboard/alerts").json()
        assert entry["verdict"]["kind"] == "finished_alerting"


def test_nonfinite_last_loss_is_diverged_on_page_and_list_alike(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        disable_loss_nonfinite(lambda p, j: c.put(p, json=j), lambda p: c.get(p).json())
        assert c.post("/api/v1/ingest", json={"frames": nanquiet()}).status_code == 200
        [row] = c.get("/api/v1/dashboard/runs").json()
        page = c.get(f"/api/v1/dashboard/runs/{row['id']}").json()
        assert row["verdict"] == page["verdict"]["kind"] == "diverged", (row, page["verdict"])
        assert row["verdict_text"] == page["verdict"]["text"]
        assert row["status"] == "diverged"


def test_diverged_one_step_after_its_first_alert_says_step() -> None:
    alerts = [alert(1, 100, rule="attn_logit_departure", metric="attn.logit_max",
                    severity="warning", layer=1, head=2),
              alert(2, 101, rule="loss_nonfinite", metric="loss")]
    v = verdict(run(status="diverged", diverged_step=101), alerts)
    assert v.kind == "diverged" and v.detail.endswith("(1 step before)"), v.detail


def test_alert_hover_label_names_every_head() -> None:
    a = alert(1, 300, rule="attn_logit_departure", metric="attn.logit_max",
              severity="warning", layer=1, head=0, heads=[0, 1, 2, 3])
    label = alert_label(a)
    assert "layer 1, heads 0, 1, 2, 3" in label, label
    one = alert(2, 300, rule="attn_logit_departure", metric="attn.logit_max", layer=0, head=1)
    assert "layer 0, head 1<br>" in alert_label(one)
    assert "rank 0, run<br>" in alert_label(alert(3, 300))


# --- in the browser -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    c = Collector(tmp_path_factory.mktemp("db") / "x.db")
    disable_loss_nonfinite(lambda p, j: httpx.put(c.url + p, json=j, timeout=30),
                           lambda p: httpx.get(c.url + p, timeout=30).json())
    ingest(c.url, gradnan())
    ingest(c.url, frames("ok-finished", 200, lambda s: 3 + 0.001 * (s % 5), end=True))
    ingest(c.url, frames("healthy-live", 200, lambda s: 3 + 0.001 * (s % 5)))
    ingest(c.url, frames("no-attention", 200, lambda s: 3 + 0.001 * (s % 5), heads=False,
                         end=True))
    ingest(c.url, nanquiet())
    ids = {r["name"]: r["id"] for r in httpx.get(f"{c.url}/api/v1/runs", timeout=30).json()}
    yield c.url, ids
    c.stop()


def open_page(chromium: Any, url: str) -> Any:
    page = chromium.new_page(viewport={"width": 1440, "height": 900})
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("['1', 'error'].includes(document.body.dataset.ready)",
                           timeout=WAIT_MS)
    assert page.evaluate("document.body.dataset.ready") == "1", page.errors
    return page


def color(page: Any, selector: str, prop: str = "color") -> str:
    return page.eval_on_selector(selector, f"e => getComputedStyle(e)['{prop}']")


GREEN = "rgb(26, 127, 55)"  # --ok
AMBER = "rgb(191, 135, 0)"  # --warn


@pytest.mark.browser
def test_finished_alerting_banner_chip_and_sort(seeded: tuple[str, dict[str, int]],
                                                chromium: Any) -> None:
    url, ids = seeded
    page = open_page(chromium, f"{url}/runs/{ids['finish-gradnan']}")
    try:
        assert page.locator("#verdict").get_attribute("data-kind") == "finished_alerting"
        assert page.locator("#verdict-word").inner_text().lower() == "finished"
        assert "critical" in page.locator("#verdict-text").inner_text()
        assert color(page, "#verdict-word") == AMBER
        assert color(page, "#verdict", "borderLeftColor") == AMBER
        page.goto(f"{url}/?sort=verdict-asc")
        page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 5",
                               timeout=WAIT_MS)
        chip = "#runs-table tbody tr[data-run-id='{}'] .verdict-chip"
        assert page.locator(chip.format(ids["finish-gradnan"])).inner_text().lower() == (
            "finished, alerting")
        assert color(page, chip.format(ids["finish-gradnan"])) == AMBER
        assert color(page, chip.format(ids["ok-finished"])) == GREEN
        names = page.eval_on_selector_all("#runs-table tbody tr td.name a",
                                          "as => as.map(a => a.textContent)")
        # with the runs that need attention: before every healthy or cleanly finished run
        assert names.index("finish-gradnan") < names.index("healthy-live"), names
        assert names.index("finish-gradnan") < names.index("ok-finished"), names
        assert not page.errors, page.errors
    finally:
        page.close()


@pytest.mark.browser
def test_no_attention_statistics_is_not_healthy_logits(seeded: tuple[str, dict[str, int]],
                                                       chromium: Any) -> None:
    url, ids = seeded
    page = open_page(chromium, f"{url}/runs/{ids['no-attention']}")
    try:
        text = page.locator("#alerts").inner_text()
        assert "Logits look healthy" not in text, text
        assert text.startswith("No alerts. No attention statistics received"), text
        assert "docs/HOOKS.md" in text
        page.goto(f"{url}/runs/{ids['healthy-live']}")
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
        assert page.locator("#alerts").inner_text() == "No alerts. Logits look healthy."
        assert not page.errors, page.errors
    finally:
        page.close()


@pytest.mark.browser
def test_run_page_agrees_with_list_on_nan_loss(seeded: tuple[str, dict[str, int]],
                                               chromium: Any) -> None:
    url, ids = seeded
    page = open_page(chromium, f"{url}/runs/{ids['nan-rule-off']}")
    try:
        assert page.locator("#verdict").get_attribute("data-kind") == "diverged"
        assert page.locator("#verdict-word").inner_text().lower() == "diverged"
        assert page.locator("#verdict-text").inner_text() == "the last loss is not finite"
    finally:
        page.close()


@pytest.mark.browser
def test_compare_draws_the_runs_that_exist(seeded: tuple[str, dict[str, int]],
                                           chromium: Any) -> None:
    url, ids = seeded
    page = open_page(chromium, f"{url}/compare?runs={ids['ok-finished']},999")
    try:
        page.wait_for_selector("#compare-charts .chart[data-metric='loss'] .scatterlayer .trace",
                               timeout=WAIT_MS)
        assert page.locator("#page-error").is_hidden(), page.locator("#page-error").inner_text()
        missing = page.locator("#compare-missing")
        assert missing.is_visible() and missing.inner_text() == (
            "No run with id 999: showing the others.")
        assert page.locator("#compare-runs a").all_inner_texts() == ["ok-finished"]
        assert page.locator("#status").inner_text() == "1 run"
    finally:
        page.close()


@pytest.mark.browser
def test_one_consequence_one_related_alert_singular(seeded: tuple[str, dict[str, int]],
                                                    chromium: Any) -> None:
    """The incident's folds say "1 consequence", "1 related alert" (the panel's rendering,
    with the run's real alerts grouped by hand)."""
    url, ids = seeded
    page = open_page(chromium, f"{url}/runs/{ids['finish-gradnan']}")
    try:
        titles = page.evaluate("""async (id) => {
            const { AlertsPanel } = await import('/static/js/alerts.js');
            const data = await (await fetch(`/api/v1/dashboard/runs/${id}`)).json();
            const [a, b, c] = data.alerts;
            const list = document.createElement('div');
            const counter = document.createElement('span');
            document.body.append(list, counter);
            const panel = new AlertsPanel(list, counter);
            panel.setIncidents([{ id: a.id, cause: a.id, severity: a.severity,
                state: 'firing', fired_step: a.fired_step,
                members: [{ id: a.id, role: 'cause' }, { id: b.id, role: 'related' },
                          { id: c.id, role: 'consequence' }] }], data.alerts);
            return [...list.querySelectorAll('details.fold > summary')].map(s => s.textContent);
        }""", ids["finish-gradnan"])
        assert titles == ["1 related alert", "1 consequence (after the divergence)"], titles
    finally:
        page.close()
