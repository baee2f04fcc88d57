"""The collector over HTTP (TestClient, lifespan on), on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings
from tests.webhook_tools import WebhookReceiver


def frame(seq: int, *, run: str = "r1", rank: int = 0, heads: Any = None,
          **scalars: Any) -> dict[str, Any]:
    return {"run": run, "rank": rank, "seq": seq, "step": seq * 10, "time": time.time(),
            "scalars": scalars or {"loss": 3.0}, "heads": heads or {}}


def growing(seq: int, grow_from: int = 20, layers: int = 2, heads: int = 4) -> dict[str, Any]:
    """Per-head max logits: flat around 5, except layer 1 head 2, which climbs after seq 20."""
    m = [[5.0 + 0.1 * h for h in range(heads)] for _ in range(layers)]
    if seq >= grow_from:
        m[1][2] = 5.0 * 1.3 ** (seq - grow_from + 1)
    return {"attn.logit_max": m}


@pytest.fixture(autouse=True)
def _rising(rising_rule: None) -> None:
    """attn_logit_rising on (off by default): the simple per-head rule these tests use to
    see an alert come back in the ingest answer and resume after a restart."""


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(db_url=db_url))) as c:
        yield c


def test_ingest_dedup_and_series_round_trip(client: TestClient) -> None:
    frames = [frame(i, loss=4.0 - i * 0.01, **{"grad.norm": 1.0}) for i in range(30)]
    r = client.post("/api/v1/ingest", json={"frames": frames})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 30 and r.json()["duplicates"] == 0
    # A resend (a retry after a lost answer) stores nothing twice.
    r = client.post("/api/v1/ingest", json={"frames": frames[10:] + [frame(30)]})
    assert (r.json()["accepted"], r.json()["duplicates"]) == (1, 20)
    runs = client.get("/api/v1/runs").json()
    assert [(x["name"], x["last_step"]) for x in runs] == [("r1", 300)]
    s = client.get(f"/api/v1/runs/{runs[0]['id']}/series", params={"name": "loss"}).json()
    assert s["total"] == 31 and s["steps"] == [i * 10 for i in range(31)]
    assert s["values"][:2] == pytest.approx([4.0, 3.99], rel=1e-6)


def test_nonfinite_values_are_stored_as_what_they_are(client: TestClient) -> None:
    frames = [frame(0, loss="NaN"), frame(1, loss="Infinity"), frame(2, loss="-Infinity"),
              frame(3, loss=1.5)]
    assert client.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
    s = client.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
    assert s["values"] == ["NaN", "Infinity", "-Infinity", 1.5]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"seq": "x"}, "seq"),
        ({"run": "a b<script>"}, "run"),
        ({"scalars": {"loss": "1.5"}}, "loss"),
        ({"scalars": {"loss": True}}, "loss"),
        ({"heads": {"attn.logit_max": [[1.0, 2.0], [3.0]]}}, "heads"),
        ({"time": -1}, "time"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_frame_rejects_whole_batch(client: TestClient, bad: dict[str, Any],
                                       field: str) -> None:
    good = frame(0)
    r = client.post("/api/v1/ingest", json={"frames": [good, {**frame(1), **bad}]})
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "invalid-request" and field in body["message"]
    assert client.get("/api/v1/runs").json() == []  # nothing of that request stored


def test_shape_change_is_rejected_and_nothing_stored(client: TestClient) -> None:
    client.post("/api/v1/ingest", json={"frames": [frame(0, heads=growing(0))]})
    r = client.post("/api/v1/ingest", json={"frames": [
        frame(1, heads=growing(1)), frame(2, heads=growing(2, layers=3))]})
    assert r.status_code == 422 and r.json()["code"] == "shape-mismatch"
    assert client.get("/api/v1/runs/1").json()["last_step"] == 0


def test_heatmap_latest_and_at_step(client: TestClient) -> None:
    client.post("/api/v1/ingest", json={"frames": [frame(i, heads=growing(i, grow_from=2))
                                                   for i in range(5)]})
    h = client.get("/api/v1/runs/1/heatmap").json()
    assert h["step"] == 40 and len(h["values"]) == 2 and len(h["values"][0]) == 4
    assert h["values"][1][2] == pytest.approx(5.0 * 1.3**3, rel=1e-6)
    assert client.get("/api/v1/runs/1/heatmap", params={"step": 15}).json()["step"] == 10
    one = client.get("/api/v1/runs/1/series",
                     params={"name": "attn.logit_max", "layer": 1, "head": 2}).json()
    assert one["values"][-1] == pytest.approx(5.0 * 1.3**3, rel=1e-6)
    assert client.get("/api/v1/runs/1/series", params={
        "name": "attn.logit_max", "layer": 9, "head": 0}).status_code == 422
    assert client.get("/api/v1/runs/7/heatmap").json()["code"] == "run-not-found"


def test_downsampling_keeps_every_spike(client: TestClient) -> None:
    vals = [1.0] * 5000
    spikes = {123: 50.0, 2222: -40.0, 4999: 99.0}
    for i, v in spikes.items():
        vals[i] = v
    frames = [frame(i, loss=v) for i, v in enumerate(vals)]
    for k in range(0, 5000, 1000):
        assert client.post("/api/v1/ingest", json={"frames": frames[k:k + 1000]}).status_code == 200
    s = client.get("/api/v1/runs/1/series", params={"name": "loss", "max_points": 200}).json()
    assert s["total"] == 5000 and len(s["steps"]) <= 200
    got = dict(zip(s["steps"], s["values"], strict=True))
    for i, v in spikes.items():
        assert got[i * 10] == v


def test_alert_fires_on_rising_head_and_comes_back_in_ingest_answer(client: TestClient) -> None:
    answers = [client.post("/api/v1/ingest", json={"frames": [frame(i, heads=growing(i))]}).json()
               for i in range(30)]
    fired = [i for i, a in enumerate(answers) if a["alerts"]]
    assert fired, "the rising head never alerted"
    first = fired[0]
    # The limit is max(floor 30, 4 x baseline 5.2) = 30, crossed at seq 26 (5*1.3^7 = 31.4);
    # held for 3 samples, it fires at seq 28.
    assert first == 28
    a = answers[first]["alerts"][0]
    assert (a["layer"], a["head"], a["rank"], a["state"]) == (1, 2, 0, "firing")
    assert a["started_step"] == 260 and a["fired_step"] == 280
    assert "layer 1, head 2" in a["message"] and a["remedies"]
    assert len(answers[-1]["alerts"]) == 1  # deduplicated: still one alert
    assert client.get("/api/v1/runs").json()[0]["open_alerts"] == 1


def test_healthy_flat_heads_do_not_alert(client: TestClient) -> None:
    for i in range(40):
        r = client.post("/api/v1/ingest",
                        json={"frames": [frame(i, heads=growing(i, grow_from=10_000))]})
        assert r.json()["alerts"] == []


def test_alert_state_resumes_after_restart(db_url: str) -> None:
    settings = Settings(db_url=db_url)
    with TestClient(create_app(settings)) as c:
        for i in range(28):  # pending since seq 26, not yet firing
            assert c.post("/api/v1/ingest",
                          json={"frames": [frame(i, heads=growing(i))]}).json()["alerts"] == []
    with TestClient(create_app(settings)) as c:  # a new process: state rebuilt from the store
        r28 = c.post("/api/v1/ingest", json={"frames": [frame(28, heads=growing(28))]}).json()
    assert r28["alerts"][0]["fired_step"] == 280 and r28["alerts"][0]["started_step"] == 260


def test_webhook_receives_alert_json(sqlite_url: str) -> None:
    with WebhookReceiver() as hook:
        with TestClient(create_app(Settings(db_url=sqlite_url, webhook_url=hook.url,
                                            webhook_info=True))) as c:  # info too
            for i in range(30):
                c.post("/api/v1/ingest", json={"frames": [frame(i, heads=growing(i))]})
            assert hook.got.wait(10), "no webhook call arrived"
    body = hook.received[0]
    assert body["kind"] == "logitwatch.alert" and "layer 1, head 2" in body["text"]
    assert body["alert"]["fired_step"] == 280 and not math.isnan(body["alert"]["value"])


def test_a_reads_error_does_not_say_nothing_was_stored(sqlite_url: str) -> None:
    """A bad query parameter on a read says what is wrong; "nothing was stored" is for the
    requests that write (an ingest refused)."""
    from fastapi.testclient import TestClient

    from logitwatch.server.app import create_app
    from logitwatch.server.settings import Settings

    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        read = c.get("/api/v1/runs?limit=nope")
        assert read.status_code == 422
        assert "nothing was stored" not in read.json()["message"]
        assert read.json()["message"].startswith("query.limit:")
        write = c.post("/api/v1/ingest", json={"frames": "nope"})
        assert write.status_code == 422
        assert "(nothing was stored)" in write.json()["message"]
