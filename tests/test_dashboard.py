"""The dashboard in headless Chromium against a real collector (uvicorn on a free port).

Seeds a run whose head (1, 2) climbs until an alert fires, checks the runs page and the run
page (three charts with data, the alert in the panel and on the loss chart), then posts more
frames and waits for them to arrive live, without a reload.
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from tests.dashboard_tools import HEADS, LAYERS, WAIT_MS, Collector, ingest, logits

pytestmark = pytest.mark.browser

RUN = "dash-run"


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path, rising_rule: None) -> Iterator[Collector]:
    c = Collector(tmp_path / "x.db")
    yield c
    c.stop()


@pytest.fixture
def collector(server: Collector) -> str:
    return server.url


@pytest.fixture
def tab(chromium: Any) -> Iterator[Any]:
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.errors = errors
    yield page
    page.close()  # closes the event stream before the collector stops


# --- data -----------------------------------------------------------------------------------


def frames(seqs: range, climbing: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    out = []
    for i in seqs:
        norm = 0.6 + 0.5 * math.sin(i / 3) ** 2 + 0.01 * i
        out.append({
            "run": RUN, "project": "browser-test", "seq": i, "step": i * 10,
            "time": time.time(),
            "scalars": {"loss": "NaN" if i == 15 else 3.0 * math.exp(-i / 25) + 0.5,
                        "grad.norm": norm, "grad.clipped": float(norm > 1.0), "lr": 1e-3},
            "heads": {"attn.logit_max": logits(i, climbing)},
        })
    return out


def figures_asked(url: str) -> list[str]:
    """The figures a request asks for, each as "kind=...&...": one for
    ``/figures/{kind}?...``, each ``f`` of a batched ``/figures?f=...&f=...``."""
    u = urlsplit(url)
    if "/figures/" in u.path:
        return [f"kind={u.path.rsplit('/', 1)[1]}&{u.query}"]
    if u.path.endswith("/figures"):
        return [v for k, v in parse_qsl(u.query) if k == "f"]
    return []


# --- screenshots, checked without image libraries -------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def png_rows_vary(data: bytes, min_distinct: int) -> bool:
    """True when the decoded rows are not all alike (a blank page has one distinct row)."""
    width, height = png_size(data)
    idat, pos = b"", 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = len(raw) // height
    # Filter bytes differ per row, but a row of one solid colour filters to (almost) zeros;
    # rows that draw something have many distinct byte patterns.
    rows = {raw[y * stride + 1:(y + 1) * stride] for y in range(0, height, 4)}
    return len(rows) >= min_distinct


def check_screenshot(path: Path, blank: bytes, *, factor: float, min_rows: int) -> None:
    """Compared with a screenshot of about:blank (one distinct row, ~6 KB at 1400 x 1000)."""
    data = path.read_bytes()
    assert len(data) > factor * len(blank), f"{path.name} looks blank ({len(data)} bytes)"
    assert png_rows_vary(data, min_rows), f"{path.name} has too few distinct rows"


# --- the test -------------------------------------------------------------------------------


def test_dashboard_live(collector: str, tab: Any, tmp_path: Path) -> None:
    page = tab
    climbing = {(1, 2): 20}  # fires at the third breach: sample 22, step 220
    answer = ingest(collector, frames(range(30), climbing))
    heads = [(a["layer"], a["head"], a["fired_step"]) for a in answer["alerts"]
             if a["layer"] is not None]
    assert (1, 2, 220) in heads and {h[:2] for h in heads} == {(1, 2)}
    run_id = httpx.get(f"{collector}/api/v1/runs").json()[0]["id"]

    page.goto("about:blank")
    blank = page.screenshot()

    # The runs page lists the run, with a link to its page and its open alert.
    page.goto(f"{collector}/")
    page.wait_for_selector(f"tr[data-run-id='{run_id}']", timeout=WAIT_MS)
    row = page.locator(f"tr[data-run-id='{run_id}']")
    assert row.locator("td.name a").inner_text() == RUN
    assert row.locator("td.name a").get_attribute("href") == f"/runs/{run_id}"
    assert "browser-test" in row.inner_text() and "290" in row.inner_text()
    firing_now = sum(a["state"] == "firing"
                     for a in httpx.get(f"{collector}/api/v1/runs/{run_id}/alerts").json())
    assert row.locator(".badge.firing").inner_text() == str(firing_now) != "0"
    page.screenshot(path=tmp_path / "runs.png")

    # The run page: three charts with data, the alert in the panel and on the loss chart.
    streams: list[str] = []  # the event streams it opens
    page.on("request", lambda r: streams.append(r.url) if "/stream" in r.url else None)
    page.goto(f"{collector}/runs/{run_id}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    js = "(id) => document.getElementById(id).data[0].y.length"
    assert page.evaluate(js, "loss") == 30
    assert page.evaluate(js, "grad_norm") == 30
    assert page.evaluate("document.getElementById('loss').data[0].y[15]") is None  # NaN: a gap
    assert page.evaluate(
        "document.getElementById('loss').data.find(t => t.meta === 'nonfinite').text"
    ) == ["loss = NaN at step 150"]
    clipped = page.evaluate(
        "document.getElementById('grad_norm').data.find(t => t.meta === 'clipped').x.length"
    )
    assert clipped > 0
    z = page.evaluate("document.getElementById('heatmap').data[0].z")
    assert len(z) == LAYERS and len(z[0]) == HEADS and z[1][2] == pytest.approx(85.0)
    assert "step 290" in page.evaluate("document.getElementById('heatmap').layout.title.text")

    card = page.locator("#alerts .alert[data-state='firing']",
                        has_text="fired at step 220").filter(has_text="layer 1 · head 2")
    assert card.count() == 1
    assert card.locator(".remedies li").count() > 0
    # The head's alert is shaded where it belongs (heads over steps), a thin mark on the loss,
    # whose own shading is the loss's alert (the NaN at step 150).
    shapes = page.evaluate("document.getElementById('loss').layout.shapes.map(s => s.x0)")
    assert 220 not in shapes and 150 in shapes
    assert 220 in page.evaluate(
        "document.getElementById('loss').data.find(t => t.meta === 'alerts-other').x"
    )
    assert 220 in page.evaluate(
        "document.getElementById('heads_time').layout.shapes.map(s => s.x0)")
    page.wait_for_function("document.getElementById('stream').textContent === 'live'",
                           timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "run.png", full_page=True)

    # More frames arrive live, without a reload; head (0, 1) climbs and fires a new alert.
    page.evaluate("window.__noReload = true")
    climbing[(0, 1)] = 30
    ingest(collector, frames(range(30, 35), climbing))
    page.wait_for_function("document.getElementById('loss').data[0].x.length === 35",
                           timeout=WAIT_MS)
    assert page.evaluate("window.__noReload") is True
    assert page.evaluate("document.getElementById('loss').data[0].x.slice(-1)[0]") == 340
    assert page.evaluate("document.getElementById('grad_norm').data[0].x.length") == 35
    assert page.evaluate("Number(document.body.dataset.livePoints)") == 5
    page.wait_for_function(
        "document.getElementById('heatmap').layout.title.text.endsWith('step 340')",
        timeout=WAIT_MS,
    )
    assert page.evaluate("document.getElementById('heatmap').data[0].z[0][1]") == 60.0
    # Live, into the open incident: folded under its cause as a related alert.
    page.wait_for_selector("#alerts .incident .fold.related .folded >> text=layer 0 · head 1",
                           state="attached", timeout=WAIT_MS)
    page.wait_for_function(
        "document.getElementById('loss').data.find(t => t.meta === 'alerts-other').x"
        ".includes(320)", timeout=WAIT_MS,
    )
    assert page.evaluate("document.getElementById('loss').data[0].x.length") == 35
    firing = [a for a in httpx.get(f"{collector}/api/v1/runs/{run_id}/alerts").json()
              if a["state"] == "firing"]
    page.wait_for_function(
        f"document.getElementById('alerts-count').textContent.endsWith('({len(firing)} alerts)')",
        timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "run-live.png", full_page=True)

    check_screenshot(tmp_path / "runs.png", blank, factor=2, min_rows=10)
    for name in ("run.png", "run-live.png"):
        check_screenshot(tmp_path / name, blank, factor=8, min_rows=100)
    assert page.errors == []
    # everything live came over the one stream the page opened: it never had to reconnect
    assert len(streams) == 1, streams


def test_unknown_run_page(collector: str, tab: Any) -> None:
    page = tab
    page.goto(f"{collector}/runs/999")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert page.locator("#run-name").inner_text() == "run 999 not found"
    # The 404 of /api/v1/runs/999 is an expected answer, logged by Chromium as a resource error.
    assert all("404" in e for e in page.errors), page.errors


def test_empty_run_fills_live_then_reconnects(server: Collector, tab: Any) -> None:
    """A run without loss or logits yet: empty charts that fill in live; then the collector
    goes away and the indicator says so."""
    page = tab
    first = {"run": RUN, "project": "browser-test", "seq": 0, "step": 0, "time": time.time(),
             "scalars": {"lr": 1e-3}}
    ingest(server.url, [first])
    run_id = httpx.get(f"{server.url}/api/v1/runs").json()[0]["id"]
    page.goto(f"{server.url}/runs/{run_id}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert page.evaluate("document.getElementById('loss').data[0].x.length") == 0
    assert page.evaluate("document.getElementById('heatmap').layout.annotations[0].text") == (
        "no attn.logit_max yet"
    )
    # no attention statistic yet: no alert says nothing about the logits
    assert page.locator("#alerts").inner_text().startswith(
        "No alerts. No attention statistics received")
    page.wait_for_function("document.getElementById('stream').textContent === 'live'",
                           timeout=WAIT_MS)

    ingest(server.url, frames(range(1, 4), {}))
    page.wait_for_function("document.getElementById('loss').data[0].x.length === 3",
                           timeout=WAIT_MS)
    page.wait_for_function(
        "document.getElementById('heatmap').layout.title.text.endsWith('step 30')",
        timeout=WAIT_MS,
    )
    assert page.evaluate("document.getElementById('heatmap').data[0].z.length") == LAYERS
    page.wait_for_function("document.getElementById('alerts').innerText === "
                           "'No alerts. Logits look healthy.'", timeout=WAIT_MS)
    assert not page.evaluate("document.getElementById('loss').layout.annotations?.length")
    assert page.evaluate("Number(document.body.dataset.livePoints)") == 3

    server.stop()
    page.wait_for_function("document.getElementById('stream').textContent === 'reconnecting'",
                           timeout=WAIT_MS)
    # Chromium logs the cut stream and the refused reconnects as network errors
    # (net::ERR_INCOMPLETE_CHUNKED_ENCODING, net::ERR_CONNECTION_REFUSED); nothing else.
    assert all("net::ERR_" in e for e in page.errors), page.errors


# --- summaries, zoom, drill-down, compare ---------------------------------------------------

BIG = 3000  # samples: more than a chart's 2000-point budget, so the full view is downsampled
SPIKE = 1500  # the sample whose loss spikes to 50


def big_frames(run: str, seqs: range, *, scale: float = 1.0) -> list[dict[str, Any]]:
    out = []
    for i in seqs:
        m = logits(i, {(1, 2): 2000})
        norm = 0.6 + 0.5 * math.sin(i / 3) ** 2
        out.append({
            "run": run, "project": "views", "seq": i, "step": i * 10, "time": time.time(),
            "scalars": {"loss": 50.0 if i == SPIKE else scale * (3.0 * math.exp(-i / 800) + 0.5),
                        "grad.norm": norm, "grad.clipped": float(norm > 1.0),
                        "lr": 1e-3 * min(1.0, i / 100), "final.hidden_rms": 1.0 + i / 3000,
                        "final.logz": 0.5 + i / 1000},
            "heads": {"attn.logit_max": m,
                      "attn.logit_p99": [[v * 0.5 for v in row] for row in m]},
        })
    return out


def test_dashboard_views_zoom_drill_compare(collector: str, tab: Any, tmp_path: Path) -> None:
    page = tab
    for lo in range(0, BIG, 1000):
        ingest(collector, big_frames("big", range(lo, lo + 1000)))
    ingest(collector, big_frames("small", range(300), scale=1.3))
    runs = {r["name"]: r["id"] for r in httpx.get(f"{collector}/api/v1/runs").json()}
    big, small = runs["big"], runs["small"]
    page.goto("about:blank")
    blank = page.screenshot()

    # Runs list: a sparkline per run, filters, ticks for a comparison.
    page.goto(f"{collector}/")
    page.wait_for_selector(f"tr[data-run-id='{big}'] svg.spark path", timeout=WAIT_MS)
    assert int(page.locator(f"tr[data-run-id='{big}'] svg.spark").get_attribute(
        "data-points")) > 10
    assert page.locator(f"tr[data-run-id='{big}'] .state").inner_text() == "running"
    page.fill("#f-q", "smal")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 1",
                           timeout=WAIT_MS)
    assert "q=smal" in page.url
    page.fill("#f-q", "")
    page.wait_for_function("document.querySelectorAll('#runs-table tbody tr').length === 2",
                           timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "runs-list.png")
    page.check(f"tr[data-run-id='{big}'] input.pick")
    page.check(f"tr[data-run-id='{small}'] input.pick")
    page.click("#compare")
    page.wait_for_url("**/compare?runs=*", timeout=WAIT_MS)
    # Compare: each chosen series overlays both runs; a zoom re-queries every chart.
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    assert f"runs={big}%2C{small}" in page.url or f"runs={big},{small}" in page.url
    metas = page.evaluate("""[...document.querySelectorAll('#compare-charts .chart')].map(
        d => [d.dataset.metric, d.data.map(t => t.meta)])""")
    assert dict(metas)["loss"][:2] == [f"run:{big}", f"run:{small}"]
    assert set(dict(metas)) == {"loss", "grad.norm", "attn.logit_max", "lr"}
    page.click("#pick input[value='final.logz']")
    page.wait_for_selector("#compare-charts .chart[data-metric='final.logz'] .scatterlayer .trace",
                           timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "compare.png", full_page=True)

    # The run page: a chart for every scalar the run has, and the per-head summaries.
    page.goto(f"{collector}/runs/{big}")
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=WAIT_MS)
    for metric in ("lr", "clip_rate", "final.hidden_rms", "final.logz"):
        n = page.evaluate(
            "(m) => document.querySelector(`.chart[data-metric='${m}']`).data[0].x.length", metric)
        assert n > 100, metric
    rate = page.evaluate("document.getElementById('clip_rate').data[0].y")
    assert 0 < max(rate) <= 1
    full = page.evaluate("document.getElementById('loss').data[0].x.length")
    assert full <= 2100 < BIG  # downsampled...
    assert 50.0 in page.evaluate("document.getElementById('loss').data[0].y")  # ...spike kept
    assert page.locator("#worst tbody tr").count() == LAYERS * HEADS
    first = page.locator("#worst tbody tr").first
    assert (first.get_attribute("data-layer"), first.get_attribute("data-head")) == ("1", "2")
    assert page.evaluate("document.getElementById('heads_time').data[0].z.length") == LAYERS
    page.select_option("#layer", "1")
    page.wait_for_function("document.getElementById('heads_time').data[0].z.length === 4",
                           timeout=WAIT_MS)
    page.select_option("#stat", "attn.logit_p99")
    page.wait_for_function(
        "document.getElementById('heatmap').layout.title.text.startsWith('attn.logit_p99')",
        timeout=WAIT_MS)

    # Zoom by dragging on the loss chart: the page asks the server for that step range and
    # every step chart shows it at full resolution, spike included.
    asked: list[str] = []  # each figure asked for, as "kind=loss&start=...": batched or not
    page.on("request", lambda r: asked.extend(figures_asked(r.url)))
    page.locator("#loss").scroll_into_view_if_needed()  # below the heads, now
    box = page.locator("#loss .nsewdrag").bounding_box()
    assert box is not None
    x_of = page.evaluate("""(s) => { const ax = document.getElementById('loss')._fullLayout.xaxis;
        return ax.l2p(s) + ax._offset; }""", 14_000)
    x_to = page.evaluate("""(s) => { const ax = document.getElementById('loss')._fullLayout.xaxis;
        return ax.l2p(s) + ax._offset; }""", 16_000)
    top = page.locator("#loss").bounding_box()
    assert top is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(top["x"] + x_of, y)
    page.mouse.down()
    page.mouse.move(top["x"] + (x_of + x_to) / 2, y, steps=4)
    page.mouse.move(top["x"] + x_to, y, steps=4)
    page.mouse.up()
    page.wait_for_function("""() => { const x = document.getElementById('loss').data[0].x;
        return x.length > 100 && x[0] >= 13000 && x[x.length - 1] <= 17000; }""", timeout=WAIT_MS)
    zoomed = [u for u in asked if "kind=loss&" in u and "start=" in u]
    assert zoomed, asked
    xs = page.evaluate("document.getElementById('loss').data[0].x")
    assert xs == list(range(xs[0], xs[-1] + 10, 10))  # every sample: full resolution
    assert 50.0 in page.evaluate("document.getElementById('loss').data[0].y")
    page.wait_for_function("""() => { const x = document.getElementById('grad_norm').data[0].x;
        return x.length && x[0] >= 13000; }""", timeout=WAIT_MS)
    assert any("kind=grad_norm&" in u and "start=" in u for u in asked)
    assert any("kind=heads_time&" in u and "start=" in u for u in asked)
    assert page.locator("#zoom-state").get_attribute("data-zoomed") == "1"

    # Drill down from the worst-heads table to one head, drawn over the run's envelope.
    page.locator("#worst tbody tr").first.click()
    page.wait_for_function("document.getElementById('drill').data?.length >= 2", timeout=WAIT_MS)
    drill = page.evaluate("document.getElementById('drill').data.map(t => t.meta)")
    assert drill[:2] == ["envelope", "series"]
    assert page.evaluate("document.getElementById('drill').data[1].x[0]") >= 13000  # zoomed too

    # The inbox: acknowledge the firing alert, silence another, both stored by the collector.
    card = page.locator("#alerts .alert[data-state='firing']").first
    alert_id = card.get_attribute("data-id")
    card.locator("button.ack").click()
    page.wait_for_selector(f"#alerts .alert[data-id='{alert_id}'] .acked", timeout=WAIT_MS)
    stored = {a["id"]: a for a in httpx.get(f"{collector}/api/v1/runs/{big}/alerts").json()}
    assert stored[int(alert_id)]["acked_at"] is not None
    resolved = page.locator("#alerts .alert[data-state='resolved']").first
    resolved.locator("button.silence").click()
    page.wait_for_selector("#alerts .alert[data-state='resolved'] .silenced", timeout=WAIT_MS)
    silences = httpx.get(f"{collector}/api/v1/alerts/silences").json()
    assert len(silences) == 1 and silences[0]["run"] == "big" and silences[0]["active"]
    page.click("#alerts-tabs button[data-filter='firing']")
    assert page.locator("#alerts .alert[data-state='resolved']").count() == 0
    page.click("#alerts-tabs button[data-filter='all']")
    page.screenshot(path=tmp_path / "run-views.png", full_page=True)

    page.click("#zoom-reset")
    page.wait_for_function(
        f"document.getElementById('loss').data[0].x.length === {full}", timeout=WAIT_MS)
    for name, factor, rows in (("runs-list.png", 2, 10), ("compare.png", 8, 100),
                               ("run-views.png", 8, 100)):
        check_screenshot(tmp_path / name, blank, factor=factor, min_rows=rows)
    assert page.errors == []
