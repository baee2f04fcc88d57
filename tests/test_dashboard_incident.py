"""The run page in headless Chromium: the incident first, then the evidence.

A run on two ranks whose head (1, 2) of rank 0 climbs until an alert fires and whose loss
then turns NaN. At 1440x900 and at 390x844 the verdict and the first alert's head and step
are inside the first screen (bounding boxes); one click opens the evidence; the incident
folds its consequences; the view (rank, statistic, head, zoom, log scale) lives in the
address; the monitor's own series are folded; /alerts and a 404 page answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard_tools import HEADS, LAYERS, WAIT_MS, Collector, ingest, logits

pytestmark = pytest.mark.browser

RUN = "incident-run"
CLIMB = 20  # head (1, 2) of rank 0 climbs from this sample
NAN_AT = 60  # the loss is NaN from this sample on


def frame(i: int, rank: int = 0) -> dict[str, Any]:
    m = logits(i, {(1, 2): CLIMB} if rank == 0 else {})
    if rank == 0 and i >= NAN_AT:
        m = [["NaN"] * HEADS for _ in range(LAYERS)]
    loss: float | str = "NaN" if rank == 0 and i >= NAN_AT else 3.0 * math.exp(-i / 25) + 0.5
    return {"run": RUN, "project": "incidents", "seq": i, "step": i * 10, "rank": rank,
            "time": time.time(), "heads": {"attn.logit_max": m},
            "scalars": {"loss": loss, "grad.norm": 0.8 + 0.01 * i, "lr": 1e-3,
                        "final.logit_max": 5.0 + i, "hooks.cost_ms": 1.5,
                        "attn.dtype_max": 65504.0}}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    mp = pytest.MonkeyPatch()
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    rules.write_text("rules:\n  - {name: attn_logit_rising, kind: departure, "
                     "metric: attn.logit_max, severity: info, for_steps: 20, for_samples: 3,\n"
                     "     params: {factor: 4.0, floor: 30.0, window: 200, lag: 50}}\n")
    mp.setenv("LOGITWATCH_ALERT_RULES", str(rules))
    c = Collector(tmp_path_factory.mktemp("db") / "x.db")
    ingest(c.url, [frame(i) for i in range(NAN_AT + 5)])
    ingest(c.url, [frame(i, rank=1) for i in range(NAN_AT + 5)])
    run_id = httpx.get(f"{c.url}/api/v1/runs").json()[0]["id"]
    yield c.url, run_id
    c.stop()
    mp.undo()


def first_alert(url: str, run_id: int) -> dict[str, Any]:
    alerts = httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()
    return min((a for a in alerts if a["layer"] is not None), key=lambda a: a["fired_step"])


def open_page(chromium: Any, url: str, width: int, height: int) -> Any:
    page = chromium.new_page(viewport={"width": width, "height": height})
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    return page


def in_first_screen(page: Any, selector: str, height: int) -> None:
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    assert box["y"] >= 0 and box["y"] + box["height"] <= height, (selector, box)
    assert page.locator(selector).is_visible(), selector


@pytest.mark.parametrize("size", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_verdict_and_first_alert_in_the_first_screen(seeded: tuple[str, int], chromium: Any,
                                                     size: tuple[int, int],
                                                     tmp_path: Path) -> None:
    url, run_id = seeded
    a = first_alert(url, run_id)
    assert (a["layer"], a["head"]) == (1, 2)
    page = open_page(chromium, f"{url}/runs/{run_id}", *size)
    height = size[1]
    assert page.locator("#verdict").get_attribute("data-kind") == "diverged"
    assert page.locator("#verdict-word").inner_text().lower() == "diverged"
    assert page.locator("#verdict-text").inner_text() == f"at step {NAN_AT * 10}"
    facts = page.locator("#incident-facts")
    assert facts.locator("[data-fact='layer']").inner_text() == "layer 1"
    assert facts.locator("[data-fact='head']").inner_text() == "head 2"
    assert facts.locator("[data-fact='rank']").inner_text() == "rank 0"
    assert facts.locator("[data-fact='step']").inner_text() == f"step {a['fired_step']}"
    assert facts.locator("[data-fact='sev']").inner_text().lower() == a["severity"]
    for sel in ("#verdict-word", "#verdict-text", "#incident-facts [data-fact='head']",
                "#incident-facts [data-fact='step']", "#incident-show"):
        in_first_screen(page, sel, height)
    # The dot is the run's (its last frame), the page's connection is shown apart.
    assert page.locator("#conn").get_attribute("data-state") == "live"
    assert page.locator("#conn").inner_text().startswith("reporting")
    page.wait_for_function("document.getElementById('stream').textContent === 'live'",
                           timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "first-screen.png")

    # One click to the evidence: the head's series opens at the alert's steps.
    page.click("#incident-show")
    page.wait_for_function("document.getElementById('drill').data?.length >= 2",
                           timeout=WAIT_MS)
    assert page.locator("#drill").get_attribute("data-layer") == "1"
    assert page.locator("#drill").get_attribute("data-head") == "2"
    page.wait_for_function("new URLSearchParams(location.search).get('head') === '1.2'",
                           timeout=WAIT_MS)
    assert "zoom=" in page.url
    assert page.locator("#drill-card").is_visible()
    assert page.errors == []
    page.close()


def test_incident_cards_shading_heads_and_url_state(seeded: tuple[str, int],
                                                    chromium: Any) -> None:
    url, run_id = seeded
    page = open_page(chromium, f"{url}/runs/{run_id}", 1440, 900)
    # Incidents earliest first, the cause's card first, severity shown; the divergence and
    # what followed it inside the same incident, consequences folded.
    first = page.locator("#alerts .incident").first
    cause = first.locator(".alert[data-role='cause']")
    assert "layer 1 · head 2" in cause.locator(".where").inner_text()
    assert cause.locator(".sev").count() >= 1
    assert "when it fired (step" in cause.inner_text().lower()
    incidents = page.evaluate("Number(document.body.dataset.incidents)")
    alerts = page.evaluate("Number(document.body.dataset.alerts)")
    assert 1 <= incidents < alerts
    div = page.locator("#alerts .alert[data-role='divergence']")
    assert div.count() == 1 and f"fired at step {NAN_AT * 10}" in div.inner_text()

    # The heads view is above the training charts; after the NaN it shows the last finite
    # step; the monitor's own series are folded and load when opened.
    heat = page.locator("#heatmap").bounding_box()
    loss = page.locator("#loss").bounding_box()
    assert heat and loss and heat["y"] < loss["y"]
    title = page.evaluate("document.getElementById('heatmap').layout.title.text")
    assert f"step {(NAN_AT - 1) * 10}" in title and "last finite" in title
    assert page.locator("#worst").get_attribute("data-nonfinite-from") == str(NAN_AT * 10)
    assert page.locator("#worst tbody tr").first.get_attribute("data-head") == "2"
    assert page.locator("#monitor").is_visible()
    assert not page.locator("#monitor-charts").is_visible()
    assert page.locator("#more-charts .chart[data-metric='hooks.cost_ms']").count() == 0
    page.click("#monitor summary")
    page.wait_for_function(
        "document.querySelector(\"#monitor-charts .chart[data-metric='hooks.cost_ms']\")?.data",
        timeout=WAIT_MS)

    # The head alert shades heads over steps, not the learning rate (a thin mark there).
    a = first_alert(url, run_id)
    lr_shapes = page.evaluate(
        "(document.querySelector(\".chart[data-metric='lr']\").layout.shapes || [])"
        ".map(s => s.x0)")
    assert a["fired_step"] not in lr_shapes
    ht = page.evaluate("document.getElementById('heads_time').layout.shapes.map(s => s.x0)")
    assert a["fired_step"] in ht

    # Log scales: the toggle for logit charts, log colours for a heatmap spanning decades.
    page.check("#log-y")
    page.wait_for_function(
        "document.querySelector(\".chart[data-metric='final.logit_max']\").layout.yaxis.type"
        " === 'log'", timeout=WAIT_MS)
    assert page.evaluate("document.getElementById('loss').layout.yaxis.type") == "log"
    assert page.evaluate("document.querySelector(\".chart[data-metric='lr']\")"
                         ".layout.yaxis.type") != "log"
    page.select_option("#color", "log")
    page.wait_for_function("document.getElementById('heads_time').layout.meta.log === true",
                           timeout=WAIT_MS)
    assert "log=1" in page.url and "color=log" in page.url

    # Rank 1: every chart and the stream follow; its heads are calm.
    assert page.locator("#rank-label").is_visible()
    page.select_option("#rank", "1")
    page.wait_for_function("new URLSearchParams(location.search).get('rank') === '1'",
                           timeout=WAIT_MS)
    page.wait_for_function(
        "document.getElementById('worst-sub').textContent.includes('step "
        f"{(NAN_AT + 4) * 10}')", timeout=WAIT_MS)
    assert page.locator("#worst").get_attribute("data-nonfinite-from") == ""

    # The address reopens the same view.
    page.goto(page.url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert page.locator("#rank").input_value() == "1"
    assert page.locator("#log-y").is_checked() and page.locator("#color").input_value() == "log"
    assert page.errors == []
    page.close()


def test_alerts_inbox_and_not_found_pages(seeded: tuple[str, int], chromium: Any) -> None:
    url, run_id = seeded
    page = open_page(chromium, f"{url}/alerts", 390, 844)
    block = page.locator(f".inbox-run[data-run-id='{run_id}']")
    assert block.get_attribute("data-verdict") == "diverged"
    assert block.locator(".incident").count() >= 1
    where = f".inbox-run[data-run-id='{run_id}'] .alert[data-role='cause'] .where"
    assert "layer 1 · head 2" in page.locator(where).first.inner_text()
    in_first_screen(page, where, 844)
    page.goto(f"{url}/no/such/page")
    assert page.locator("#nf-path").inner_text() == "/no/such/page"
    assert page.locator("a[href='/alerts']").count() >= 1
    page.goto(f"{url}/runs/999")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert page.locator("#run-name").inner_text() == "run 999 not found"
    assert page.locator("#verdict a[href='/']").count() == 1
    assert all("404" in e for e in page.errors), page.errors
    page.close()
