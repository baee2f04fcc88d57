"""The run page in headless Chromium: its figures in one request, smoothing that keeps the
spikes, the hover shared by the line charts, and the heads an alert fired on read from the
collector's data (not from its message).

A run whose loss has a spike at step 500 and whose head (1, 2) of rank 0 climbs until an
alert fires; head (1, 0) climbs later and joins that open alert.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.dashboard_tools import HEADS, LAYERS, WAIT_MS, Collector, ingest

pytestmark = pytest.mark.browser

RUN = "page-run"
N = 80
SPIKE = 50  # the loss is SPIKE_VALUE at this sample
SPIKE_VALUE = 40.0


def heads(i: int) -> list[list[float]]:
    m = [[5.0 + 0.1 * ((i + layer + h) % 3) for h in range(HEADS)] for layer in range(LAYERS)]
    if i >= 20:
        m[1][2] = 40.0 + 5.0 * (i - 20)
    if i >= 45:
        m[1][0] = 40.0 + 5.0 * (i - 45)
    return m


def frame(i: int) -> dict[str, Any]:
    loss = SPIKE_VALUE if i == SPIKE else 3.0 * math.exp(-i / 30) + 0.5 + 0.05 * ((i * 7) % 5)
    return {"run": RUN, "project": "page", "seq": i, "step": i * 10, "time": time.time(),
            "heads": {"attn.logit_max": heads(i)},
            "scalars": {"loss": loss, "grad.norm": 0.8 + 0.01 * i, "lr": 1e-3,
                        "final.logit_max": 5.0 + i}}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Any]]:
    mp = pytest.MonkeyPatch()
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    rules.write_text("rules:\n  - {name: attn_logit_rising, kind: departure, "
                     "metric: attn.logit_max, severity: warning, for_steps: 20, "
                     "for_samples: 3,\n     params: {factor: 4.0, floor: 30.0, window: 200, "
                     "lag: 50}}\n")
    mp.setenv("LOGITWATCH_ALERT_RULES", str(rules))
    db = tmp_path_factory.mktemp("db") / "x.db"
    c = Collector(db)
    ingest(c.url, [frame(i) for i in range(N)])
    run_id = httpx.get(f"{c.url}/api/v1/runs").json()[0]["id"]
    yield c.url, run_id, db
    c.stop()
    mp.undo()


def open_page(chromium: Any, url: str, size: tuple[int, int] = (1440, 900)) -> Any:
    page = chromium.new_page(viewport={"width": size[0], "height": size[1]})
    page.errors = []
    page.requests = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("request", lambda q: page.requests.append(q.url))
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    return page


def figure_requests(page: Any) -> list[str]:
    return [u for u in page.requests if "/figures" in u]


def test_one_request_for_the_figures(seeded: tuple[str, int, Any], chromium: Any) -> None:
    url, run_id, _ = seeded
    page = open_page(chromium, f"{url}/runs/{run_id}")
    for sel in ("#loss", "#grad_norm", "#heatmap", "#heads_time",
                ".chart[data-metric='lr']", ".chart[data-metric='final.logit_max']"):
        assert page.evaluate(f"document.querySelector(\"{sel}\").data.length") >= 1, sel
    figs = figure_requests(page)
    assert len(figs) == 1 and f"/runs/{run_id}/figures?f=" in figs[0], figs
    data = [u for u in page.requests if "/api/" in u and "/stream" not in u]
    # the page's data, its figures, the worst heads, the silences (for the alert cards)
    assert len(data) <= 4, data
    # A zoom redraws every step chart with one request more.
    page.evaluate("Plotly.relayout(document.getElementById('loss'), "
                  "{'xaxis.range[0]': 100, 'xaxis.range[1]': 400})")
    page.wait_for_function("document.body.dataset.figureRequests === '2'", timeout=WAIT_MS)
    page.wait_for_function("new URLSearchParams(location.search).get('zoom') === '100-400'",
                           timeout=WAIT_MS)
    page.wait_for_timeout(300)
    assert len(figure_requests(page)) == 2 and "start%3D100" in figure_requests(page)[1]
    assert page.errors == []
    page.close()


def smooth_of(page: Any, sel: str) -> dict[str, Any]:
    return page.evaluate(f"""(() => {{
      const d = document.querySelector("{sel}").data;
      const raw = d.find(t => t.meta === 'series');
      const sm = d.find(t => t.meta === 'smooth');
      const max = (ys) => Math.max(...ys.filter(y => y !== null));
      return {{ rawMax: max(raw.y), opacity: raw.opacity ?? 1,
               smoothMax: sm ? max(sm.y) : null, n: sm ? sm.y.length : 0, raw: raw.y.length }};
    }})()""")


@pytest.mark.parametrize("size", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
def test_smoothing_keeps_the_spike(seeded: tuple[str, int, Any], chromium: Any,
                                   size: tuple[int, int]) -> None:
    url, run_id, _ = seeded
    page = open_page(chromium, f"{url}/runs/{run_id}", size)
    assert smooth_of(page, "#loss")["smoothMax"] is None  # off by default
    box = page.locator("#smooth").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= size[0]
    page.select_option("#smooth", "ema")
    page.wait_for_function("document.getElementById('loss').data.some(t => t.meta === 'smooth')",
                           timeout=WAIT_MS)
    s = smooth_of(page, "#loss")
    assert s["rawMax"] == SPIKE_VALUE and s["opacity"] < 1  # the spike, faint behind
    assert s["smoothMax"] < SPIKE_VALUE / 2 and s["n"] == s["raw"]
    assert page.locator("#smooth-amount").is_visible()
    page.wait_for_function(
        "document.querySelector(\".chart[data-metric='lr']\").data.some(t => t.meta === 'smooth')",
        timeout=WAIT_MS)
    assert "smooth=ema-60" in page.url
    # Stronger: the slider, let go.
    page.evaluate("""(() => { const r = document.getElementById('smooth-amount'); r.value = '90';
      r.dispatchEvent(new Event('input')); r.dispatchEvent(new Event('change')); })()""")
    page.wait_for_function("new URLSearchParams(location.search).get('smooth') === 'ema-90'",
                           timeout=WAIT_MS)
    page.wait_for_function(f"(() => {{ const t = document.getElementById('loss').data"
                           f".find(t => t.meta === 'smooth'); return t && Math.max(...t.y) < "
                           f"{s['smoothMax']}; }})()", timeout=WAIT_MS)
    assert page.locator("#smooth-value").inner_text() == "weight 0.90"
    # The address reopens it; a rolling median ignores the lone spike entirely.
    page.goto(page.url)
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert page.locator("#smooth").input_value() == "ema"
    assert page.locator("#smooth-amount").input_value() == "90"
    assert smooth_of(page, "#loss")["smoothMax"] is not None
    page.select_option("#smooth", "median")
    page.wait_for_function("new URLSearchParams(location.search).get('smooth') === 'median-9'",
                           timeout=WAIT_MS)
    page.wait_for_function("(() => { const t = document.getElementById('loss').data"
                           ".find(t => t.meta === 'smooth');"
                           " return t && Math.max(...t.y) < 5; })()", timeout=WAIT_MS)
    assert smooth_of(page, "#loss")["rawMax"] == SPIKE_VALUE
    page.select_option("#smooth", "")
    page.wait_for_function("!document.getElementById('loss').data.some(t => t.meta === 'smooth')",
                           timeout=WAIT_MS)
    assert "smooth=" not in page.url and smooth_of(page, "#loss")["opacity"] == 1
    assert page.errors == []
    page.close()


def test_shared_hover(seeded: tuple[str, int, Any], chromium: Any) -> None:
    url, run_id, _ = seeded
    page = open_page(chromium, f"{url}/runs/{run_id}")
    page.locator("#loss").scroll_into_view_if_needed()
    drag = page.locator("#loss .nsewdrag").bounding_box()
    assert drag is not None
    page.mouse.move(drag["x"] + drag["width"] * 0.5, drag["y"] + drag["height"] * 0.5)
    page.wait_for_function("document.getElementById('loss')._hoverdata?.length > 0",
                           timeout=WAIT_MS)
    step = page.evaluate("document.getElementById('loss')._hoverdata[0].x")
    for sel in ("#grad_norm", ".chart[data-metric='lr']", ".chart[data-metric='final.logit_max']"):
        page.wait_for_function(f"document.querySelector(\"{sel}\")._hoverdata?.length > 0",
                               timeout=WAIT_MS)
        assert page.evaluate(f"document.querySelector(\"{sel}\")._hoverdata[0].x") == step, sel
        assert page.locator(f"{sel} .hoverlayer .hovertext").count() >= 1, sel
    # Leaving the chart hides them all.
    page.mouse.move(2, 2)
    page.wait_for_function("document.querySelectorAll('#grad_norm .hoverlayer .hovertext')"
                           ".length === 0", timeout=WAIT_MS)
    assert page.errors == []
    page.close()


def test_fired_heads_come_from_data(seeded: tuple[str, int, Any], chromium: Any) -> None:
    url, run_id, db = seeded
    [a] = [a for a in httpx.get(f"{url}/api/v1/runs/{run_id}/alerts").json()
           if a["rule"] == "attn_logit_rising"]
    # It fired on head 2; head 0 breached later and joined it.
    assert a["heads"] == [2, 0] and a["fired_heads"] == [2] and a["fired_layer"] == 1
    # Without any head in its message, the page still says which head it fired on.
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alerts SET message = 'logits left their range' WHERE id = ?",
                    (a["id"],))
    page = open_page(chromium, f"{url}/runs/{run_id}", (390, 844))
    card = page.locator(f"#alerts .alert[data-id='{a['id']}']")
    assert "layer 1 · head 2" in card.locator(".where").inner_text()
    assert card.locator(".chip", has_text="now heads 0, 2").count() == 1
    facts = page.locator("#incident-facts")
    assert facts.locator("[data-fact='head']").inner_text() == "head 2"
    assert page.errors == []
    page.close()
