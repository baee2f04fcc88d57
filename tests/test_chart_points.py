"""A series of one point is drawn as a point (Plotly draws no line through a lone point, so
such a chart looked empty): the run page in headless Chromium against a real collector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from logitwatch.demo.runner import Collector

pytestmark = pytest.mark.browser

#: The loss chart's line trace: its mode and how many marker points Plotly drew for it.
SERIES = """() => {
  const gd = document.getElementById("loss");
  const i = (gd.data || []).findIndex((t) => t.meta === "series");
  if (i < 0) return null;
  const drawn = gd.querySelectorAll(".scatterlayer .trace")[i];
  return {mode: gd.data[i].mode, n: gd.data[i].x.length,
          points: drawn ? drawn.querySelectorAll("path.point").length : 0};
}"""


@pytest.fixture
def col(tmp_path: Path) -> Iterator[Collector]:
    with Collector(f"sqlite:///{tmp_path / 'points.db'}", stream_interval=0.2) as c:
        yield c


def ingest(url: str, run: str, steps: range) -> None:
    frames = [{"run": run, "seq": s, "step": s, "time": time.time(),
               "scalars": {"loss": 3.0 - 0.01 * s}} for s in steps]
    r = httpx.post(f"{url}/api/v1/ingest", json={"frames": frames}, timeout=60)
    assert r.status_code == 200, r.text


def series(page: Any) -> dict[str, Any]:
    page.wait_for_function(f"({SERIES})() !== null", timeout=15_000)
    out: dict[str, Any] = page.evaluate(SERIES)
    return out


def test_a_one_point_series_shows_its_point(col: Collector, chromium: Any) -> None:
    ingest(col.url, "lone", range(1))
    ingest(col.url, "long", range(50))
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{col.url}/runs/1")
        lone = series(page)
        assert lone["n"] == 1 and "markers" in lone["mode"]
        assert lone["points"] == 1, lone  # drawn, not only declared

        page.goto(f"{col.url}/runs/2")
        long = series(page)
        assert long["n"] == 50 and long["mode"] == "lines"  # a line needs no markers
    finally:
        page.close()
