"""The dashboard in headless Chromium against a real collector (uvicorn on a free port).

Seeds a run whose head (1, 2) climbs until an alert fires, checks the runs page and the run
page (three charts with data, the alert in the panel and on the loss chart), then posts more
frames and waits for them to arrive live, without a reload.
"""

from __future__ import annotations

import math
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--no-first-run"]
LAYERS, HEADS = 2, 4
RUN = "dash-run"
WAIT_MS = 10_000


# --- fixtures -------------------------------------------------------------------------------


# Fixture names avoid pytest-playwright's (``browser``, ``page``) should that plugin be installed.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's Chromium at /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


class Collector:
    """A real collector on 127.0.0.1:<free port>, served by uvicorn in a background thread."""

    def __init__(self, db: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        app = create_app(Settings(db_url=f"sqlite:///{db}", stream_interval=0.2))
        self.server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2,
        ))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive(), "the collector failed to start"
            assert time.monotonic() < deadline, "the collector did not start within 15 s"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the collector did not stop"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Collector]:
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


def logits(i: int, climbing: dict[tuple[int, int], int]) -> list[list[float]]:
    """Every head sits near 5; a head in ``climbing`` jumps to 40+ from sample ``start``."""
    m = [[5.0 + 0.1 * ((i + 3 * layer + head) % 4) for head in range(HEADS)]
         for layer in range(LAYERS)]
    for (layer, head), start in climbing.items():
        if i >= start:
            m[layer][head] = 40.0 + 5.0 * (i - start)
    return m


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


def ingest(url: str, batch: list[dict[str, Any]]) -> dict[str, Any]:
    r = httpx.post(f"{url}/api/v1/ingest", json={"frames": batch}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


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
    t0 = time.monotonic()
    climbing = {(1, 2): 20}  # fires at the third breach: sample 22, step 220
    answer = ingest(collector, frames(range(30), climbing))
    assert [(a["layer"], a["head"], a["fired_step"]) for a in answer["alerts"]] == [(1, 2, 220)]
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
    assert row.locator(".badge.firing").inner_text() == "1"
    page.screenshot(path=tmp_path / "runs.png")

    # The run page: three charts with data, the alert in the panel and on the loss chart.
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

    card = page.locator("#alerts .alert[data-state='firing']")
    assert card.count() == 1
    assert "layer 1 · head 2" in card.inner_text() and "fired at step 220" in card.inner_text()
    assert card.locator(".remedies li").count() > 0
    shapes = page.evaluate("document.getElementById('loss').layout.shapes.map(s => s.x0)")
    assert 220 in shapes
    assert page.evaluate(
        "document.getElementById('loss').data.find(t => t.meta === 'alerts').x"
    ) == [220]
    page.wait_for_function("document.getElementById('conn').textContent === 'live'",
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
    page.wait_for_selector("#alerts .alert[data-state='firing'] >> text=layer 0 · head 1",
                           timeout=WAIT_MS)
    page.wait_for_function(
        "document.getElementById('loss').data.find(t => t.meta === 'alerts').x.length === 2",
        timeout=WAIT_MS,
    )
    assert page.evaluate("document.getElementById('loss').data[0].x.length") == 35
    assert page.locator("#alerts-count").inner_text() == "2 firing"
    page.screenshot(path=tmp_path / "run-live.png", full_page=True)

    check_screenshot(tmp_path / "runs.png", blank, factor=2, min_rows=10)
    for name in ("run.png", "run-live.png"):
        check_screenshot(tmp_path / name, blank, factor=8, min_rows=100)
    assert page.errors == []
    assert time.monotonic() - t0 < 30


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
    assert page.locator("#alerts").inner_text() == "No alerts. Logits look healthy."
    page.wait_for_function("document.getElementById('conn').textContent === 'live'",
                           timeout=WAIT_MS)

    ingest(server.url, frames(range(1, 4), {}))
    page.wait_for_function("document.getElementById('loss').data[0].x.length === 3",
                           timeout=WAIT_MS)
    page.wait_for_function(
        "document.getElementById('heatmap').layout.title.text.endsWith('step 30')",
        timeout=WAIT_MS,
    )
    assert page.evaluate("document.getElementById('heatmap').data[0].z.length") == LAYERS
    assert not page.evaluate("document.getElementById('loss').layout.annotations?.length")
    assert page.evaluate("Number(document.body.dataset.livePoints)") == 3

    server.stop()
    page.wait_for_function("document.getElementById('conn').textContent === 'reconnecting'",
                           timeout=WAIT_MS)
    # Chromium logs the cut stream and the refused reconnects as network errors
    # (net::ERR_INCOMPLETE_CHUNKED_ENCODING, net::ERR_CONNECTION_REFUSED); nothing else.
    assert all("net::ERR_" in e for e in page.errors), page.errors
