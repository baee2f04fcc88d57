"""The dashboard's pure figure builders, and the route that serves them."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.figures import (
    COLORS,
    grad_norm_figure,
    heatmap_figure,
    loss_figure,
)
from logitwatch.server.schemas import AlertOut, HeatmapOut, SeriesOut
from logitwatch.server.settings import Settings


def series(name: str, steps: list[int], values: list[float]) -> SeriesOut:
    return SeriesOut(name=name, rank=0, total=len(steps), steps=steps, values=values)


def alert(
    id: int = 1, *, started: int = 200, fired: int = 220, state: str = "firing",
    layer: int | None = 1, head: int | None = 2, value: float | None = 61.2,
) -> AlertOut:
    return AlertOut(
        id=id, run_id=1, run="r", project="default", rule="attn_logit_rising",
        metric="attn.logit_max", severity="warning", state=state, rank=0, layer=layer,
        head=head, started_step=started, fired_step=fired, fired_at=0.0, resolved_step=None,
        value=value, baseline=7.9, threshold=31.6, message="m", evidence={}, remedies=["x"],
    )


def roles(fig) -> dict[str, int]:
    return {t.meta: i for i, t in enumerate(fig.data)}


def strict_json(fig) -> dict:
    """The figure as the route sends it, parsed by a JSON parser that rejects NaN/Infinity."""
    import plotly.io as pio

    def reject(token: str) -> None:
        raise AssertionError(f"non-JSON constant {token} in figure JSON")

    return json.loads(pio.to_json(fig, validate=False), parse_constant=reject)


# --- loss -----------------------------------------------------------------------------------


def test_loss_figure_traces_and_values() -> None:
    fig = loss_figure(series("loss", [0, 10, 20], [3.0, 2.5, 2.0]), [])
    assert [t.meta for t in fig.data] == ["series", "nonfinite", "alerts"]
    line = fig.data[0]
    assert line.type == "scatter" and line.mode == "lines"
    assert list(line.x) == [0, 10, 20]
    assert list(line.y) == [3.0, 2.5, 2.0]
    assert line.line.color == COLORS["loss"]
    assert fig.layout.uirevision == "loss"
    assert fig.layout.title.text == "loss"
    assert not fig.layout.shapes
    assert not fig.layout.annotations


def test_loss_figure_nonfinite_values_are_gaps_and_markers() -> None:
    fig = loss_figure(
        series("loss", [0, 10, 20, 30], [3.0, math.nan, math.inf, 2.0]), []
    )
    r = roles(fig)
    assert list(fig.data[r["series"]].y) == [3.0, None, None, 2.0]
    nf = fig.data[r["nonfinite"]]
    assert list(nf.x) == [10, 20]
    assert list(nf.text) == ["loss = NaN at step 10", "loss = Infinity at step 20"]
    assert nf.yaxis == "y2"
    out = strict_json(fig)  # no NaN / Infinity tokens
    assert out["data"][0]["y"] == [3.0, None, None, 2.0]


def test_loss_figure_alerts_are_shaded_lines_and_hover_markers() -> None:
    alerts = [alert(1, started=200, fired=220), alert(2, started=300, fired=320, layer=0, head=1,
                                                      state="resolved", value=None)]
    fig = loss_figure(series("loss", [0, 100, 200, 300], [3.0, 2.0, 1.5, 1.4]), alerts)
    shapes = fig.layout.shapes
    assert len(shapes) == 4
    spans = [s for s in shapes if s.type == "rect"]
    lines = [s for s in shapes if s.type == "line"]
    assert [(s.x0, s.x1) for s in spans] == [(200, 220), (300, 320)]
    assert [s.x0 for s in lines] == [220, 320] and all(s.yref == "paper" for s in lines)
    assert lines[0].line.color == COLORS["alert_firing"]
    assert lines[1].line.color == COLORS["alert_resolved"]
    markers = fig.data[roles(fig)["alerts"]]
    assert list(markers.x) == [220, 320]
    assert list(markers.customdata) == [1, 2]
    assert "layer 1, head 2" in markers.text[0]
    assert "layer 0, head 1" in markers.text[1] and "non-finite" in markers.text[1]
    strict_json(fig)


def test_loss_figure_empty_series_says_no_data() -> None:
    fig = loss_figure(series("loss", [], []), [])
    assert len(fig.data) == 3
    assert list(fig.data[0].x) == []
    assert fig.layout.annotations[0].text == "no loss yet"


# --- grad norm ------------------------------------------------------------------------------


def test_grad_norm_figure_marks_clipped_steps_in_red() -> None:
    norm = series("grad.norm", [0, 10, 20, 30], [0.5, 1.5, 0.7, 2.0])
    clipped = series("grad.clipped", [0, 10, 20, 30], [0.0, 1.0, 0.0, 1.0])
    fig = grad_norm_figure(norm, clipped, [alert()])
    r = roles(fig)
    assert set(r) == {"series", "clipped", "nonfinite", "alerts"}
    assert list(fig.data[r["series"]].y) == [0.5, 1.5, 0.7, 2.0]
    clip = fig.data[r["clipped"]]
    assert list(clip.x) == [10, 30]
    assert list(clip.y) == [1.5, 2.0]  # on the norm line
    assert clip.marker.color == COLORS["clipped"]
    assert fig.layout.uirevision == "grad_norm"
    assert len(fig.layout.shapes) == 2


def test_grad_norm_figure_clipped_between_downsampled_norm_points() -> None:
    norm = series("grad.norm", [0, 20], [1.0, 3.0])
    clipped = series("grad.clipped", [10], [1.0])
    fig = grad_norm_figure(norm, clipped, [])
    assert list(fig.data[roles(fig)["clipped"]].y) == [2.0]


def test_grad_norm_figure_without_clipped_series_and_nonfinite_norm() -> None:
    fig = grad_norm_figure(series("grad.norm", [0, 10], [1.0, -math.inf]), None, [])
    r = roles(fig)
    assert list(fig.data[r["clipped"]].x) == []
    assert list(fig.data[r["series"]].y) == [1.0, None]
    assert list(fig.data[r["nonfinite"]].text) == ["grad.norm = -Infinity at step 10"]
    strict_json(fig)


# --- heatmap --------------------------------------------------------------------------------


def test_heatmap_figure_is_layers_by_heads() -> None:
    m = [[1.0, 2.0, 3.0], [4.0, 5.0, 60.0]]
    fig = heatmap_figure(HeatmapOut(name="attn.logit_max", rank=0, step=290, values=m))
    assert len(fig.data) == 1
    hm = fig.data[0]
    assert hm.type == "heatmap"
    assert [list(row) for row in hm.z] == m
    assert list(hm.x) == [0, 1, 2]  # heads
    assert list(hm.y) == [0, 1]  # layers
    assert hm.colorbar.title.text == "attn.logit_max"
    assert "step 290" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "head" and fig.layout.yaxis.title.text == "layer"
    assert fig.layout.meta == {"step": 290, "title": "attn.logit_max by layer × head",
                               "metric": "attn.logit_max", "log": False, "log_floor": None,
                               "nonfinite_from": None}
    assert fig.layout.uirevision == "heatmap"


def test_heatmap_figure_nonfinite_cells() -> None:
    m = [[1.0, math.nan], [math.inf, 2.0]]
    fig = heatmap_figure(HeatmapOut(name="attn.logit_max", rank=0, step=5, values=m))
    assert [list(row) for row in fig.data[0].z] == [[1.0, None], [None, 2.0]]
    assert [list(row) for row in fig.data[0].text] == [["1", "NaN"], ["Infinity", "2"]]
    strict_json(fig)


def test_heatmap_figure_without_data() -> None:
    fig = heatmap_figure(HeatmapOut(name="attn.logit_max", rank=0, step=None, values=[]))
    assert list(fig.data[0].z) == []
    assert fig.layout.annotations[0].text == "no attn.logit_max yet"
    assert fig.layout.meta["step"] is None


# --- the route ------------------------------------------------------------------------------


def frame(seq: int, **scalars: float | str) -> dict:
    return {"run": "fig-run", "seq": seq, "step": seq * 10, "time": time.time(),
            "scalars": scalars,
            "heads": {"attn.logit_max": [[1.0, 2.0], [3.0, 4.0 + seq]]}}


@pytest.fixture
def client(tmp_path: Path):
    with TestClient(create_app(Settings(db_url=f"sqlite:///{tmp_path}/f.db"))) as c:
        yield c


def test_figures_route(client: TestClient) -> None:
    frames = [frame(i, loss=3.0 - 0.1 * i, **{"grad.norm": 0.5 + 0.2 * i,
                                              "grad.clipped": float(i >= 4)})
              for i in range(6)]
    frames[2]["scalars"]["loss"] = "NaN"
    assert client.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
    run_id = client.get("/api/v1/runs").json()[0]["id"]

    r = client.get(f"/api/v1/runs/{run_id}/figures/loss")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    fig = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert fig["data"][0]["x"] == [0, 10, 20, 30, 40, 50]
    assert fig["data"][0]["y"][2] is None
    assert fig["data"][1]["text"] == ["loss = NaN at step 20"]

    fig = client.get(f"/api/v1/runs/{run_id}/figures/grad_norm",
                     params={"start": 10, "end": 40}).json()
    assert fig["data"][0]["x"] == [10, 20, 30, 40]
    assert fig["data"][1]["x"] == [40]

    fig = client.get(f"/api/v1/runs/{run_id}/figures/heatmap", params={"step": 25}).json()
    assert fig["data"][0]["z"] == [[1.0, 2.0], [3.0, 6.0]]
    assert fig["layout"]["meta"]["step"] == 20


def test_figures_route_errors(client: TestClient) -> None:
    r = client.get("/api/v1/runs/1/figures/loss")
    assert r.status_code == 404 and r.json()["code"] == "run-not-found"
    client.post("/api/v1/ingest", json={"frames": [frame(0, loss=1.0)]})
    r = client.get("/api/v1/runs/1/figures/pie")
    assert r.status_code == 404 and r.json()["code"] == "figure-not-found"
    assert "loss, grad_norm, heatmap" in r.json()["message"]
    # A metric the run has not logged yet is an empty chart, not an error.
    fig = client.get("/api/v1/runs/1/figures/grad_norm").json()
    assert fig["data"][0]["x"] == []
    assert fig["layout"]["annotations"][0]["text"] == "no grad.norm yet"


def test_heatmap_of_a_diverged_step_says_so() -> None:
    nan = float("nan")
    fig = heatmap_figure(HeatmapOut(name="attn.logit_max", rank=0, step=980,
                                    values=[[nan, nan], [nan, float("inf")]]))
    texts = [a.text for a in fig.layout.annotations]
    assert any("step 980 is non-finite" in t for t in texts)
    fine = heatmap_figure(HeatmapOut(name="attn.logit_max", rank=0, step=1,
                                     values=[[1.0, nan]]))
    assert not fine.layout.annotations


# --- dashboard views (server/store/views.py) on SQLite and PostgreSQL ----------------------


def head_frame(seq: int, *, run: str = "v", layers: int = 3, heads: int = 4,
               **scalars: float | str) -> dict:
    """Head (1, 2) climbs from seq 20; head (2, 0) is NaN at seq 7; entropy mirrors it."""
    m = [[1.0 + layer + 0.1 * head for head in range(heads)] for layer in range(layers)]
    if seq >= 20:
        m[1][2] = 10.0 * (seq - 19)
    if seq == 7:
        m[2][0] = "NaN"
    ent = [[5.0 - (v if isinstance(v, float) else 0.0) / 100 for v in row] for row in m]
    return {"run": run, "seq": seq, "step": seq * 10, "time": time.time(), "scalars": scalars,
            "heads": {"attn.logit_max": m, "attn.entropy": ent}}


@pytest.fixture
def views_client(db_url: str):
    with TestClient(create_app(Settings(db_url=db_url))) as c:
        frames = [head_frame(i, loss=3.0 - 0.01 * i, **{"grad.clipped": float(i % 4 == 0)})
                  for i in range(40)]
        assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
        yield c


def test_heads_over_time_layer_slice_and_envelope(views_client: TestClient) -> None:
    c = views_client
    one = c.get("/api/v1/runs/1/heads_time", params={"layer": 1}).json()
    assert one["total"] == 40 and one["bucket"] == 1 and len(one["values"]) == 4
    assert one["values"][2][-1] == 200.0 and one["values"][0][0] == pytest.approx(2.0)
    # Buckets keep their maximum: the climbing head's last bucket holds its last value.
    coarse = c.get("/api/v1/runs/1/heads_time", params={"layer": 1, "max_cols": 8}).json()
    assert coarse["bucket"] == 5 and len(coarse["steps"]) == 8
    assert coarse["values"][2][-1] == 200.0 and coarse["steps"][:2] == [0, 50]
    env = c.get("/api/v1/runs/1/heads_time", params={"max_cols": 4}).json()
    assert env["layer"] is None and len(env["values"]) == 3 and env["reduce"] == "max"
    assert env["values"][1][-1] == 200.0
    # The NaN cell is skipped by its layer's max (other heads are finite).
    assert env["values"][2][0] == pytest.approx(3.3)
    ranged = c.get("/api/v1/runs/1/heads_time", params={"layer": 1, "start": 100,
                                                        "end": 150}).json()
    assert ranged["steps"] == [100, 110, 120, 130, 140, 150]
    low = c.get("/api/v1/runs/1/heads_time", params={"name": "attn.entropy", "layer": 1}).json()
    assert low["reduce"] == "min"
    r = c.get("/api/v1/runs/1/heads_time", params={"layer": 9})
    assert r.status_code == 422 and r.json()["code"] == "bad-selector"
    assert c.get("/api/v1/runs/1/heads_time", params={"name": "nope"}).json()["values"] == []


def test_worst_heads(views_client: TestClient) -> None:
    w = views_client.get("/api/v1/runs/1/worst_heads", params={"k": 3, "window": 10}).json()
    assert w["step"] == 390 and w["order"] == "highest" and w["window"] == 10
    top = w["rows"][0]
    assert (top["layer"], top["head"], top["value"]) == (1, 2, 200.0)
    assert top["before"] == 110.0 and top["change"] == 90.0
    assert top["trend_steps"] == list(range(300, 400, 10)) and top["alert"] == "firing"
    assert len(w["rows"]) == 3 and w["rows"][1]["value"] <= 200.0
    ent = views_client.get("/api/v1/runs/1/worst_heads",
                           params={"name": "attn.entropy", "k": 1}).json()
    assert ent["order"] == "lowest" and (ent["rows"][0]["layer"], ent["rows"][0]["head"]) == (1, 2)
    r = views_client.get("/api/v1/runs/1/worst_heads", params={"name": "loss"})
    assert r.status_code == 422 and r.json()["code"] == "not-per-head"


def test_runs_overview_sparklines_and_filters(views_client: TestClient) -> None:
    c = views_client
    more = [head_frame(i, run="w", loss="NaN" if i == 2 else 1.0) for i in range(3)]
    c.post("/api/v1/ingest", json={"frames": more})
    runs = c.get("/api/v1/dashboard/runs").json()
    by = {r["name"]: r for r in runs}
    assert by["v"]["loss_steps"][0] == 0 and by["v"]["loss_steps"][-1] == 390
    assert len(by["v"]["loss_steps"]) == 40 and by["v"]["status"] == "running"
    assert by["w"]["status"] == "diverged" and by["w"]["last_loss"] == "NaN"
    assert [r["name"] for r in c.get("/api/v1/dashboard/runs", params={"q": "W"}).json()] == ["w"]
    assert [r["name"] for r in c.get("/api/v1/dashboard/runs",
                                     params={"status": "diverged"}).json()] == ["w"]
    alerting = [r["name"] for r in c.get("/api/v1/dashboard/runs",
                                         params={"alerting": True}).json()]
    assert "v" in alerting and alerting == [r["name"] for r in runs if r["open_alerts"]]
    assert c.get("/api/v1/dashboard/runs", params={"project": "other"}).json() == []
    r = c.get("/api/v1/dashboard/runs", params={"status": "sleepy"})
    assert r.status_code == 422 and r.json()["code"] == "bad-status"
    # The cache extends a sparkline with new frames only; bounded by re-downsampling.
    c.post("/api/v1/ingest", json={"frames": [head_frame(i, loss=0.5) for i in range(40, 400)]})
    v = next(r for r in c.get("/api/v1/dashboard/runs").json() if r["name"] == "v")
    assert v["loss_steps"][-1] == 3990 and len(v["loss_steps"]) <= 70
    assert max(v["loss_values"]) == 3.0 and min(v["loss_values"]) == 0.5
    # At most max_runs runs are kept (a page listed is kept whole); a run dropped is read
    # again, the same, when it is listed again.
    from logitwatch.server.store.runs_view import SparklineCache

    cache = c.app.state.sparklines = SparklineCache(max_runs=1)  # type: ignore[attr-defined]
    assert len(c.get("/api/v1/dashboard/runs").json()) == 2 and len(cache) == 2
    assert [r["name"] for r in c.get("/api/v1/dashboard/runs", params={"q": "W"}).json()] == ["w"]
    assert len(cache) == 1 and list(cache._runs) == [by["w"]["id"]]
    again = next(r for r in c.get("/api/v1/dashboard/runs").json() if r["name"] == "v")
    assert (again["loss_steps"], again["loss_values"]) == (v["loss_steps"], v["loss_values"])


def test_clip_rate_series_and_compare(views_client: TestClient) -> None:
    c = views_client
    fig = c.get("/api/v1/runs/1/figures/clip_rate").json()
    y = fig["data"][0]["y"]
    assert y[0] == 1.0 and y[3] == 0.25 and y[-1] == 0.25  # 1 in 4 clipped, 20-sample mean
    assert fig["layout"]["yaxis"]["title"]["text"] == "clip rate"
    c.post("/api/v1/ingest", json={"frames": [head_frame(i, run="w", loss=2.0)
                                              for i in range(5)]})
    fig = c.get("/api/v1/compare/figure", params={"runs": "1,2", "name": "loss"}).json()
    assert [t["meta"] for t in fig["data"]] == ["run:1", "run:2"]
    assert fig["data"][1]["y"] == [2.0] * 5
    fig = c.get("/api/v1/compare/figure", params={"runs": "1,2", "name": "grad.clipped"}).json()
    assert [t["meta"] for t in fig["data"]] == ["run:1"]
    assert "not logged by: w" in fig["layout"]["annotations"][0]["text"]
    fig = c.get("/api/v1/compare/figure", params={"runs": "1,2", "name": "attn.logit_max",
                                                  "layer": 1, "head": 2}).json()
    assert fig["data"][0]["y"][-1] == 200.0
    meta = c.get("/api/v1/compare/metrics", params={"runs": "2,1"}).json()
    assert [r["name"] for r in meta["runs"]] == ["w", "v"]
    assert "grad.clipped" in [m["name"] for m in meta["metrics"]]
    for bad, code in (("x", "bad-runs"), ("", "bad-runs"), ("1,99", "run-not-found"),
                      ("1,99999999999999999999", "bad-runs"), ("0", "bad-runs"),
                      (",".join(["1"] * 11), "too-many-runs")):
        r = c.get("/api/v1/compare/figure", params={"runs": bad})
        assert r.json()["code"] == code, (bad, r.text)
    drill = c.get("/api/v1/runs/1/figures/series",
                  params={"name": "attn.logit_max", "layer": 1, "head": 2}).json()
    assert [t["meta"] for t in drill["data"]][:2] == ["envelope", "series"]
    assert c.get("/api/v1/runs/1/figures/series").json()["code"] == "missing-name"
    hm = c.get("/api/v1/runs/1/figures/heatmap", params={"name": "attn.entropy"}).json()
    assert hm["layout"]["meta"]["metric"] == "attn.entropy"
    alerts = next(t for t in hm["data"] if t["meta"] == "alerts")
    assert (alerts["x"], alerts["y"]) == ([2], [1])


def test_line_and_compare_figures_escape_names() -> None:
    from logitwatch.server.figures import compare_figure, line_figure

    evil = "<img src=x onerror=alert(1)>%{y}"
    fig = line_figure(series(evil, [0, 10], [1.0, float("nan")]), [alert()], title=evil)
    assert "<img" not in fig.layout.title.text and "&lt;img" in fig.layout.title.text
    assert roles(fig) == {"series": 0, "nonfinite": 1, "alerts": 2}
    strict_json(fig)
    fig = compare_figure(evil, [(1, evil, series("loss", [0], [float("inf")])), (2, "b", None)])
    assert all("<img" not in (t.name or "") for t in fig.data)
    assert "not logged by: b" in fig.layout.annotations[0].text
    strict_json(fig)


def test_a_run_made_under_a_deleted_runs_id_gets_its_own_sparkline(sqlite_url: str) -> None:
    """SQLite gives the next run the id of a deleted newest run: the runs list must not show
    the deleted run's loss (and status) for it."""
    def frames(run: str, loss: float, n: int) -> dict:
        return {"frames": [{"run": run, "seq": i, "step": i, "time": time.time(),
                            "scalars": {"loss": loss + 0.01 * i}} for i in range(n)]}

    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        c.post("/api/v1/ingest", json=frames("keep", 1.0, 2))
        c.post("/api/v1/ingest", json=frames("A", 5.0, 10))
        a = next(r for r in c.get("/api/v1/dashboard/runs").json() if r["name"] == "A")
        assert a["loss_values"][-1] == pytest.approx(5.09)
        assert c.delete(f"/api/v1/runs/{a['id']}", params={"confirm": "A"}).status_code == 200
        time.sleep(0.01)  # a later creation time, as any real new run has
        c.post("/api/v1/ingest", json=frames("B", 2.0, 3))
        b = next(r for r in c.get("/api/v1/dashboard/runs").json() if r["name"] == "B")
        assert b["id"] == a["id"]  # the id reused: what the cache must see through
        assert b["loss_steps"] == [0, 1, 2] and b["last_loss"] == pytest.approx(2.02)
