"""What the run page says first, without a browser: verdicts, incidents, alert marks on the
charts they are about, log colour scales, the last finite step after a NaN, the batched
page data, the cross-run inbox, the 404 page and compressed assets."""

from __future__ import annotations

import math
from typing import Any

from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.figures import heads_time_figure, heatmap_figure, loss_figure
from logitwatch.server.schemas import AlertOut, HeatmapOut, RunOut, SeriesOut
from logitwatch.server.settings import Settings
from logitwatch.server.store.incidents import incidents, verdict
from logitwatch.server.store.views import HeadsTimeOut


def alert(id: int, fired: int, *, rule: str = "attn_logit_departure",
          metric: str = "attn.logit_max", severity: str = "warning", state: str = "firing",
          layer: int | None = 1,
          head: int | None = 3, heads: list[int] | None = None, started: int | None = None,
          resolved: int | None = None, suppressed: str | None = None,
          evidence: dict[str, Any] | None = None) -> AlertOut:
    return AlertOut(
        id=id, run_id=1, run="r", project="p", rule=rule, metric=metric, severity=severity,
        state=state, rank=0, layer=layer, head=head, heads=heads,
        started_step=fired - 20 if started is None else started, fired_step=fired, fired_at=0.0,
        paged_step=fired if severity != "info" else None, resolved_step=resolved, value=1.0,
        baseline=1.0, threshold=1.0, message="m", evidence=evidence or {}, remedies=[],
        suppressed=suppressed,
    )


def run(**kw: Any) -> RunOut:
    base = {"id": 1, "project": "p", "name": "r", "created_at": 0.0, "last_step": 990,
            "last_time": 1.0, "open_alerts": 0}
    return RunOut(**{**base, **kw})


def demo_alerts() -> list[AlertOut]:
    """The demo's unstable run: a forecast over every head, departures, then the NaN."""
    return [
        alert(1, 210, rule="attn_logit_forecast", layer=None, head=None, started=0,
              evidence={"at_layer": 1, "at_head": 3}),
        alert(2, 270, heads=[0, 1, 3, 2], head=0),
        alert(3, 680, layer=0, head=1),
        alert(4, 959, rule="loss_nonfinite", metric="loss", severity="critical", layer=None,
              head=None),
        alert(5, 959, rule="grad_nonfinite", metric="grad.norm", severity="critical",
              layer=None, head=None, suppressed="inhibited"),
        alert(6, 979, rule="final_rms_departure", metric="final.hidden_rms", layer=None,
              head=None, suppressed="inhibited"),
    ]


def test_incident_starts_at_its_cause_and_folds_consequences() -> None:
    [inc] = incidents(demo_alerts(), diverged_step=959)
    roles = {m.id: m.role for m in inc.members}
    assert roles == {1: "cause", 2: "related", 3: "related", 4: "divergence",
                     5: "consequence", 6: "consequence"}
    assert (inc.cause, inc.layer, inc.head, inc.fired_step) == (1, 1, 3, 210)
    assert inc.severity == "critical" and inc.state == "firing" and inc.diverged_step == 959
    v = verdict(run(status="diverged", diverged_step=959), demo_alerts(), [inc])
    assert v.kind == "diverged" and v.text == "diverged at step 959" and v.first_alert == 1
    assert "step 210" in v.detail and "layer 1, head 3" in v.detail
    assert "749 steps before" in v.detail


def test_near_duplicates_fold_and_resolved_incidents_split() -> None:
    a = [alert(1, 100, rule="attn_logit_rising", severity="info", state="resolved",
               resolved=150),
         alert(2, 105, state="resolved", resolved=160),  # same head, 5 steps later
         alert(3, 400, layer=0, head=0)]  # after both resolved: a new incident
    first, second = incidents(a)
    assert [(m.id, m.role, m.duplicate_of) for m in first.members] == [
        (1, "cause", None), (2, "duplicate", 1)]
    assert first.state == "resolved" and first.resolved_step == 160
    assert second.cause == 3 and second.state == "firing"


def test_verdicts() -> None:
    assert verdict(run(last_step=None), []).kind == "empty"
    assert verdict(run(), []).kind == "healthy"
    assert verdict(run(), [alert(1, 100, severity="info")]).kind == "healthy"
    w = verdict(run(), [alert(1, 100)])
    assert w.kind == "warning" and w.text == "warning: 1 alert firing"
    assert verdict(run(status="finished", end_step=990), []).text == "finished at step 990"
    assert verdict(run(status="stopped"), []).kind == "stopped"


def test_alerts_shade_only_their_own_chart_and_clamp_step_zero_ranges() -> None:
    loss = SeriesOut(name="loss", rank=0, total=3, steps=[0, 500, 1000], values=[3.0, 2.0, 1.0])
    a = [alert(1, 300, metric="loss", layer=None, head=None, started=0), alert(2, 600)]
    fig = loss_figure(loss, a, own=lambda x: x.metric == "loss")
    spans = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.x0, s.x1) for s in spans] == [(200, 300)]  # clamped to 10% of the axis
    metas = {t.meta: t for t in fig.data}
    assert list(metas["alerts"].x) == [300]
    assert list(metas["alerts-other"].x) == [600]  # a thin mark, no span, no line


def test_log_colour_scales() -> None:
    h = HeatmapOut(name="attn.logit_max", rank=0, step=5, values=[[5.0, 150.0], [60000.0, -3.0]])
    fig = heatmap_figure(h)  # auto: spans four decades
    assert fig.layout.meta["log"] is True
    z = fig.data[0].z
    assert math.isclose(z[0][1], math.log10(150.0)) and z[1][1] == math.log10(5.0)
    assert fig.data[0].text[1][0] == "6e+04"
    assert list(fig.data[0].colorbar.ticktext)[:3] == ["1", "10", "100"]
    assert heatmap_figure(h, color="linear").layout.meta["log"] is False
    t = HeadsTimeOut(name="attn.logit_max", rank=0, layer=None, layers=1, heads=2,
                     reduce="max", total=2, bucket=1, steps=[0, 10],
                     values=[[5.0, 50000.0]])
    assert heads_time_figure(t).layout.meta["log"] is True
    assert heads_time_figure(t, color="linear").data[0].z[0][1] == 50000.0


def frame(i: int, nan: bool = False) -> dict[str, Any]:
    m = [[5.0 + i, 6.0], [7.0, 8.0 + 10 * i]]
    if nan:
        m = [["NaN", "NaN"], [7.0, "NaN"]]
    return {"run": "d", "project": "p", "seq": i, "step": i * 10, "time": 1000.0 + i,
            "scalars": {"loss": "NaN" if nan else 2.0}, "heads": {"attn.logit_max": m}}


def test_page_data_last_finite_step_inbox_404_and_gzip(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        frames = [frame(i) for i in range(30)] + [frame(i, nan=True) for i in range(30, 34)]
        assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
        d = c.get("/api/v1/dashboard/runs/1").json()
        assert d["verdict"]["kind"] == "diverged" and d["ranks"] == [0]
        assert d["incidents"] and {m["name"] for m in d["metrics"]} >= {"loss", "attn.logit_max"}
        # After the NaN: the heads of the last finite step, and since when.
        w = c.get("/api/v1/runs/1/worst_heads").json()
        assert (w["step"], w["nonfinite_from"], w["latest_step"]) == (290, 300, 330)
        assert w["rows"][0]["value"] == 298.0
        fig = c.get("/api/v1/runs/1/figures/heatmap").json()
        meta = fig["layout"]["meta"]
        assert meta["step"] == 290 and meta["nonfinite_from"] == 300
        assert "last finite" in fig["layout"]["title"]["text"]
        inbox = c.get("/api/v1/dashboard/alerts").json()
        assert inbox[0]["run"]["name"] == "d" and inbox[0]["verdict"]["kind"] == "diverged"
        assert c.get("/alerts").status_code == 200
        page = c.get("/no/such/page", headers={"Accept": "text/html"})
        assert page.status_code == 404 and "every run" in page.text
        api = c.get("/api/v1/nope")
        assert api.status_code == 404 and api.json()["code"]
        js = c.get("/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
        assert js.headers["content-encoding"] == "gzip"
        assert int(js.headers["content-length"]) < 2_000_000
        css = c.get("/static/style.css", headers={"Accept-Encoding": "gzip"})
        assert css.headers["content-encoding"] == "gzip"


def test_inbox_keeps_a_firing_run_before_newer_resolved_ones(sqlite_url: str) -> None:
    """The inbox's cut (``limit``) comes after ordering firing runs first: many runs with
    newer resolved alerts must not push out an older run that is still firing."""
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        diverged = [{**frame(i, nan=i >= 3), "run": "old-diverged"} for i in range(6)]
        assert c.post("/api/v1/ingest", json={"frames": diverged}).status_code == 200
        for k in range(5):  # a first-loss alert each, resolved by the next frames
            frames = [{"run": f"r{k}", "project": "p", "seq": i, "step": i, "time": 2000.0 + i,
                       "scalars": {"loss": 100.0 if i == 0 else 2.0}} for i in range(12)]
            assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
        every = c.get("/api/v1/dashboard/alerts").json()
        assert [r["run"]["name"] for r in every][:1] == ["old-diverged"]
        assert len(every) == 6 and all(
            i["state"] == "resolved" for r in every[1:] for i in r["incidents"])
        cut = c.get("/api/v1/dashboard/alerts", params={"limit": 3}).json()
        assert [r["run"]["name"] for r in cut] == ["old-diverged", "r4", "r3"]
        firing = c.get("/api/v1/dashboard/alerts", params={"state": "firing", "limit": 2}).json()
        assert [r["run"]["name"] for r in firing] == ["old-diverged"]
        resolved = c.get("/api/v1/dashboard/alerts",
                         params={"state": "resolved", "limit": 2}).json()
        assert [r["run"]["name"] for r in resolved] == ["r4", "r3"]


def test_heads_over_time_reads_a_chunk_at_a_time(sqlite_url: str, monkeypatch: Any) -> None:
    """The heads-over-steps chart reduces its columns a chunk of matrices at a time: the same
    columns as one whole read (NaN, Inf, columns split across chunks, a zoom), and memory
    that does not grow with the run (it held every matrix: ~22 KB a sample of 32x32)."""
    import tracemalloc

    import numpy as np
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, session_scope
    from logitwatch.server.store import queries, views

    rng = np.random.default_rng(3)
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        for a in range(0, 3_000, 1_000):
            frames = []
            for i in range(a, a + 1_000):
                m = rng.standard_normal((16, 16)) * 10 + i * 0.01
                m[i % 16, 3] = math.nan if i % 97 == 0 else m[i % 16, 3]
                cells = [[("Infinity" if i == 1234 and h == 0 else
                           "NaN" if math.isnan(v) else float(v)) for h, v in enumerate(row)]
                         for row in m]
                frames.append({"run": "long", "seq": i, "step": 2 * i, "time": 1000.0 + i,
                               "scalars": {"loss": 2.0},
                               "heads": {"attn.logit_max": cells, "attn.entropy": cells}})
            assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
    engine = make_engine(sqlite_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            for kw in ({"name": "attn.logit_max"}, {"name": "attn.entropy"},
                       {"name": "attn.logit_max", "layer": 5, "max_cols": 7},
                       {"name": "attn.entropy", "start": 301, "end": 4_099, "max_cols": 1999},
                       {"name": "attn.logit_max", "max_cols": 5_000}):
                monkeypatch.setattr(queries, "CHUNK_VALUES", 10**9)
                whole = views.heads_over_time(s, run_id=1, **kw)
                monkeypatch.setattr(queries, "CHUNK_VALUES", 256 * 37)
                tracemalloc.start()
                got = views.heads_over_time(s, run_id=1, **kw)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                assert got == whole, kw
                assert peak < 4_000_000, (kw, peak)  # a whole read: 15-25 MB
            assert whole.total == 3_000 and len(whole.steps) == 3_000
    finally:
        engine.dispose()


def test_an_alert_over_every_head_marks_the_head_that_held_the_max(sqlite_url: str) -> None:
    """A rule ``over: max`` (the default forecast is one) fires with no layer or head of its
    own; the heatmap's outline, the worst heads' alert column and the heads-over-steps
    marker read where it fired (fired_layer / fired_heads), as the incident panel does."""
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        r = c.put("/api/v1/alerts/rules/mx", json={
            "kind": "threshold", "metric": "attn.logit_max", "params": {"op": ">", "value": 30},
            "over": "max", "severity": "critical"})
        assert r.status_code in (200, 201), r.text
        frames = []
        for i in range(30):
            m = [[5.0] * 4 for _ in range(2)]
            m[1][2] = 50.0 if i >= 2 else 5.0
            frames.append({"run": "hm", "seq": i, "step": i, "time": 1000.0 + i,
                           "scalars": {"loss": 2.0}, "heads": {"attn.logit_max": m}})
        assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
        mx = [a for a in c.get("/api/v1/runs/1/alerts").json() if a["rule"] == "mx"]
        assert [(a["layer"], a["fired_layer"], a["fired_heads"]) for a in mx] == [(None, 1, [2])]
        fig = c.get("/api/v1/runs/1/figures/heatmap").json()
        assert [(t["x"], t["y"]) for t in fig["data"] if t.get("meta") == "alerts"] == [
            ([2], [1])]
        worst = c.get("/api/v1/runs/1/worst_heads").json()["rows"][0]
        assert (worst["layer"], worst["head"], worst["alert"]) == (1, 2, "firing")
        for layer, y in ((1, 2), (None, 1)):
            params = {"layer": layer} if layer is not None else {}
            ht = c.get("/api/v1/runs/1/figures/heads_time", params=params).json()
            marks = next(t for t in ht["data"] if t.get("meta") == "alerts")
            assert marks["y"] == [y] and marks["x"] == [mx[0]["fired_step"]], layer
        other = c.get("/api/v1/runs/1/figures/heads_time", params={"layer": 0}).json()
        assert next(t for t in other["data"] if t.get("meta") == "alerts")["y"] == []


def test_run_page_by_name_and_search_of_non_ascii_config(sqlite_url: str) -> None:
    """The API takes a run's name wherever it takes its id, and so does the run page's URL;
    what cannot name a run gets the 404 page. The runs list's filter matches a config value
    as typed ("wikipédia"), not as JSON's escape of it."""
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        assert c.post("/api/v1/ingest", json={"frames": [frame(0)]}).status_code == 200
        assert c.put("/api/v1/runs/d/config",
                     json={"data": "wikipédia", "note": "日本"}).status_code == 200
        page = c.get("/runs/d", headers={"Accept": "text/html"})
        assert page.status_code == 200 and "<html" in page.text.lower()
        bad = c.get("/runs/no such run!", headers={"Accept": "text/html"})
        assert bad.status_code == 404 and "every run" in bad.text
        for q in ("wikipédia", "日本", "WIKIP"):
            found = c.get("/api/v1/dashboard/runs", params={"q": q}).json()
            assert [r["name"] for r in found] == ["d"], q


def test_a_zoomed_clip_rate_reads_its_range_not_the_run(sqlite_url: str, monkeypatch: Any
                                                         ) -> None:
    """The clip rate (a 20-sample mean of every step's grad.clipped) of a zoom reads the
    zoom and the 19 samples before it (it read the whole run: 0.7 s and 28 MB a request
    at 100,000 steps, zoomed or not), with the same values as from the whole series."""
    import numpy as np
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, session_scope
    from logitwatch.server.store import queries, views

    clipped = [1.0 if (i * 7919) % 11 < 3 else 0.0 for i in range(3_000)]
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        frames = [{"run": "c", "seq": i, "step": 2 * i, "time": 1000.0 + i,
                   "scalars": {"loss": 2.0, "grad.clipped": v}} for i, v in enumerate(clipped)]
        assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
    read: list[int] = []
    real = queries.scalar_arrays

    def spy(*a: Any, **kw: Any) -> Any:
        got = real(*a, **kw)
        read.append(len(got[0]))
        return got

    monkeypatch.setattr(queries, "scalar_arrays", spy)
    x = np.asarray(clipped)
    rate = np.array([x[max(0, i - 19):i + 1].mean() for i in range(len(x))])
    engine = make_engine(sqlite_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            for start, end in ((2_000, 2_398), (0, 40), (10, 30), (5_990, None)):
                got = views.clip_rate(s, run_id=1, start=start, end=end, max_points=10_000)
                lo, hi = (start + 1) // 2, len(x) if end is None else end // 2 + 1
                assert got.steps == list(range(2 * lo, 2 * hi, 2)), (start, end)
                np.testing.assert_allclose(got.values, rate[lo:hi])
                assert read[-1] <= hi - lo + 19, (start, end, read[-1])
    finally:
        engine.dispose()
