"""The alert engine over a real database: lifecycle, restart-resume, grouping, inhibition,
silences, no data, the persistent webhook outbox, the alerts API and the CLI."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.cli import main as cli
from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.app import create_app
from logitwatch.server.db.models import Alert, AlertRule, OutboxItem, Run, Silence
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.notify import WebhookNotifier
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings
from logitwatch.server.store.alerts import alert_out, list_alerts
from logitwatch.server.store.ingest import ingest_frames
from tests.alert_frames import feed

SCENARIOS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"


def _scenario_header(name: str) -> dict[str, Any]:
    """The header line of a recorded scenario (``bench/scenarios/<name>.jsonl.gz``)."""
    with gzip.open(SCENARIOS / f"{name}.jsonl.gz", "rt") as fh:
        return json.loads(fh.readline())
#: The defaults with attn_logit_rising on (off by default): the simplest per-head rule, the
#: subject of the lifecycle tests below
RULES = [dataclasses.replace(r, enabled=True) if r.name == "attn_logit_rising" else r
         for r in DEFAULT_RULES]


def frame(i: int, *, run: str = "r1", heads: Any = None, **scalars: Any) -> dict[str, Any]:
    return {"run": run, "rank": 0, "seq": i, "step": i * 10, "time": 1000.0 + i,
            "scalars": scalars, "heads": heads or {}}


def logits(i: int, rising: tuple[tuple[int, int], ...] = (), start: int = 20) -> dict[str, Any]:
    """2 layers x 4 heads of max logits near 5; the ``rising`` cells double each sample
    from sample ``start``."""
    m = [[5.0 + 0.1 * ((i + h) % 3) for h in range(4)] for _ in range(2)]
    for layer, head in rising:
        if i >= start:
            m[layer][head] = 5.0 * 2 ** (i - start + 1)
    return {"attn.logit_max": m}


def alerts(sessions: sessionmaker[Session]) -> list[Alert]:
    with sessions() as s:
        return list(s.scalars(select(Alert).order_by(Alert.id)).all())


def test_grouping_one_alert_for_heads_of_a_layer(sessions: sessionmaker[Session]) -> None:
    eng = AlertEngine(RULES)
    frames = [frame(i, heads=logits(i, rising=((1, 1), (1, 3))), loss=2.0) for i in range(26)]
    changed = feed(sessions, eng, frames)
    rising = [a for a in alerts(sessions) if a.rule == "attn_logit_rising"]
    assert len(rising) == 1, [(a.layer, a.heads) for a in rising]
    a = rising[0]
    assert (a.layer, a.head, a.heads) == (1, 1, [1, 3])
    assert a.started_step == 220 and a.fired_step == 240  # 40 > floor 30 at sample 22
    assert "layer 1, heads 1, 3" in a.message and "left its range at step 220" in a.message
    assert any("QK-norm" in r for r in a.remedies)
    assert a.id in {c.id for c in changed}


def test_state_resumes_after_restart(sessions: sessionmaker[Session]) -> None:
    frames = [frame(i, heads=logits(i, rising=((0, 2),)), loss=2.0) for i in range(30)]
    one = AlertEngine(RULES)
    feed(sessions, one, frames[:23])  # sample 22: pending, not yet firing
    assert [a.rule for a in alerts(sessions) if a.rule == "attn_logit_rising"] == []
    two = AlertEngine(RULES)  # a restarted collector
    feed(sessions, two, frames[23:])
    got = [(a.rule, a.started_step, a.fired_step) for a in alerts(sessions)]
    assert ("attn_logit_rising", 220, 240) in got
    assert len([g for g in got if g[0] == "attn_logit_rising"]) == 1
    three = AlertEngine(RULES)  # restarted again while firing: no second alert
    feed(sessions, three, [frame(i, heads=logits(i, rising=((0, 2),)), loss=2.0)
                           for i in range(30, 33)])
    assert len([a for a in alerts(sessions) if a.rule == "attn_logit_rising"]) == 1


def test_inhibition_holds_back_head_alerts_while_loss_diverged(
        sessions: sessionmaker[Session]) -> None:
    eng = AlertEngine(RULES)
    frames = [frame(i, heads=logits(i, rising=((0, 0),), start=22),
                    loss=2.0 if i < 20 else "NaN") for i in range(30)]
    changed = feed(sessions, eng, frames)
    by_rule = {a.rule: a for a in alerts(sessions)}
    assert by_rule["loss_nonfinite"].suppressed is None
    head = by_rule["attn_logit_rising"]
    assert head.suppressed == "inhibited" and head.evidence["inhibited_by"] == "loss_nonfinite"
    assert head.id not in {c.id for c in changed}
    with sessions() as s:
        from logitwatch.server.store.alerts import firing_alerts

        assert [a.rule for a in firing_alerts(s, [head.run_id])] == ["loss_nonfinite"]


def test_silence_stores_but_does_not_notify(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as s:
        now = time.time()
        s.add(Silence(project=None, run="r1", rule="attn_logit_rising", rank=None, layer=None,
                      starts_at=now - 1, ends_at=now + 3600, comment="known", created_by="t"))
    eng = AlertEngine(RULES)
    changed = feed(sessions, eng, [frame(i, heads=logits(i, rising=((1, 2),)), loss=2.0)
                                   for i in range(26)])
    a = next(a for a in alerts(sessions) if a.rule == "attn_logit_rising")
    assert a.suppressed == "silenced" and a.id not in {c.id for c in changed}


def test_no_data_fires_then_resolves(sessions: sessionmaker[Session]) -> None:
    eng = AlertEngine(RULES)
    feed(sessions, eng, [frame(i, loss=2.0) for i in range(5)])
    with session_scope(sessions) as s:
        assert eng.check_stale(s, now=1004.0 + 100) == []  # 100 s: fine
        fired = eng.check_stale(s, now=1004.0 + 700)
        assert [a.rule for a in fired] == ["no_data"] and "no data for 700 s" in fired[0].message
        assert eng.check_stale(s, now=1004.0 + 800) == []  # deduplicated
    feed(sessions, eng, [frame(5, loss=2.0)])
    nd = next(a for a in alerts(sessions) if a.rule == "no_data")
    assert nd.state == "resolved" and nd.resolved_step == 50


def test_lr_jump_and_loss_jump_say_what_happened(sessions: sessionmaker[Session]) -> None:
    eng = AlertEngine(RULES)
    frames = [frame(i, loss=2.5 - 0.001 * i, lr=0.01, **{"grad.norm": 0.5}) for i in range(25)]
    frames.append(frame(25, loss=7.0, lr=0.5, **{"grad.norm": 30.0}))
    feed(sessions, eng, frames)
    got = {a.rule: a for a in alerts(sessions)}
    assert got["lr_jump"].fired_step == 250 and got["loss_jump"].fired_step == 250
    assert "learning rate changed from 0.01 to 0.5" in got["loss_jump"].message
    assert "gradient norm jumped" in got["loss_jump"].message


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: Any) -> None:
        pass


def test_webhook_retries_survive_a_collector_restart(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/hook"
    server.server_close()  # nothing listens yet: deliveries fail and wait in the outbox
    eng = AlertEngine(RULES)
    feed(sessions, eng, [frame(i, heads=logits(i, rising=((0, 1),)), loss=2.0)
                         for i in range(25)])
    with sessions() as s:
        a = next(a for a in s.scalars(select(Alert)) if a.rule == "attn_logit_rising")
        run = s.get(Run, a.run_id)
        assert run is not None
        out = alert_out(a, run)
    first = WebhookNotifier(url, retries=50, sessions=sessions, base_delay=0.05)
    first.notify(out)
    deadline = time.time() + 10
    while time.time() < deadline:
        with sessions() as s:
            item = s.scalars(select(OutboxItem)).first()
            if item is not None and item.attempts >= 1:
                break
        time.sleep(0.05)
    first.close()  # the collector stops with the alert undelivered
    assert item is not None and item.attempts >= 1 and item.last_error
    _Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", port), _Hook)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    second = WebhookNotifier(url, retries=50, sessions=sessions, base_delay=0.05)
    try:
        deadline = time.time() + 15
        while time.time() < deadline and not _Hook.received:
            time.sleep(0.05)
    finally:
        second.close()
        server.shutdown()
        server.server_close()
        engine.dispose()
    assert len(_Hook.received) == 1
    body = _Hook.received[0]
    assert body["kind"] == "logitwatch.alert" and "layer 0, head 1" in body["text"]
    assert body["alert"]["rule"] == "attn_logit_rising" and "What to do" in body["text"]


def test_alerts_api_rules_silences_ack(sqlite_url: str) -> None:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        rules = c.get("/api/v1/alerts/rules").json()
        assert {"attn_logit_rising", "loss_jump", "no_data"} <= {r["name"] for r in rules}
        r = c.put("/api/v1/alerts/rules/big_loss",
                  json={"kind": "threshold", "metric": "loss", "params": {"value": 8.0},
                        "severity": "critical"})
        assert r.status_code == 200, r.text
        bad = c.put("/api/v1/alerts/rules/x", json={"kind": "threshold", "metric": "loss",
                                                    "params": {"nope": 1}})
        assert bad.status_code == 422 and "unknown params" in bad.json()["message"]
        bad = c.put("/api/v1/alerts/rules/x", json={"kind": "departure", "metric": "loss",
                                                    "params": {"margin": "abc"}})
        assert bad.status_code == 422 and "must be a number" in bad.json()["message"]
        held = c.put("/api/v1/alerts/rules/wide_dep",
                     json={"kind": "departure", "metric": "attn.logit_max",
                           "keep_firing_for": 40,
                           "downgrade": {"to": "info", "loss_rise": 0.5}}).json()
        assert held["keep_firing_for"] == 40 and held["downgrade"]["loss_rise"] == 0.5
        assert held["downgrade"]["metric"] == "attn.dtype_max"
        bad = c.put("/api/v1/alerts/rules/x", json={"kind": "departure", "metric": "m",
                                                    "downgrade": {"to": "loud"}})
        assert bad.status_code in (400, 422) and "downgrade.to" in bad.json()["message"]
        assert c.delete("/api/v1/alerts/rules/wide_dep").status_code == 200
        ans = c.post("/api/v1/ingest", json={"frames": [frame(0, loss=9.0)]}).json()
        assert [a["rule"] for a in ans["alerts"]] == ["big_loss"]
        aid = ans["alerts"][0]["id"]
        acked = c.post(f"/api/v1/alerts/{aid}/ack", json={}).json()
        assert acked["acked_at"] is not None and acked["state"] == "firing"
        s = c.post("/api/v1/alerts/silences", json={"run": "r1", "duration_s": 60}).json()
        assert s["active"] and c.get("/api/v1/alerts/silences").json()[0]["id"] == s["id"]
        assert not c.delete(f"/api/v1/alerts/silences/{s['id']}").json()["active"]
        assert c.delete("/api/v1/alerts/rules/big_loss").status_code == 200
        assert "big_loss" not in {r["name"] for r in c.get("/api/v1/alerts/rules").json()}


@pytest.mark.skipif(not (SCENARIOS / "lr_jump.jsonl.gz").exists(),
                    reason="no recorded scenarios")
def test_cli_replay_and_alerts(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    runner = CliRunner()
    r = runner.invoke(cli, ["replay", str(SCENARIOS / "lr_jump.jsonl.gz"), "--db", db])
    assert r.exit_code == 0, r.output
    assert "lr_jump" in r.output and "diverged at step" in r.output
    if (SCENARIOS / "fp32_growth.jsonl.gz").exists():
        r = runner.invoke(cli, ["replay", str(SCENARIOS / "fp32_growth.jsonl.gz"), "--db",
                                f"sqlite:///{tmp_path / 'g.db'}"])
        assert r.exit_code == 0, r.output
        grown = _scenario_header("fp32_growth")["regression"]
        assert f"ended {grown:.3f} nat above its best loss: degraded" in r.output
    r = runner.invoke(cli, ["alerts", "--run", "lr_jump", "--json", "--db", db])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)  # output also holds stderr's "store: ..." line
    header = _scenario_header("lr_jump")
    first = min(a["fired_step"] for a in got if a["severity"] != "info")
    assert first <= header["divergence_step"]
    engine = make_engine(db)
    try:
        with sessionmaker(engine)() as s:
            assert len(list_alerts(s, got[0]["run_id"])) == len(got)
    finally:
        engine.dispose()


# -- hold (keep_firing_for): one episode, one alert ----------------------------------------

HOT = [RuleSpec("hot_loss", "threshold", "loss", params={"value": 5.0}, keep_firing_for=50)]
# fires at step 30; clear at 40, 50, 60; breaches again at 70 (within the 50-step hold)
REBREACH = [2, 2, 2, 9, 2, 2, 2, 9, 2, 2, 2, 2, 2, 2, 2]
# fires at step 30; clear from 40: resolved at 90 (hold over); breaches again at 100
BEYOND = [2, 2, 2, 9, 2, 2, 2, 2, 2, 2, 9, 2]


@pytest.mark.parametrize("restart_at", [None, 5, 8])
def test_rebreach_within_hold_is_one_alert(sessions: sessionmaker[Session],
                                           restart_at: int | None) -> None:
    frames = [frame(i, loss=v) for i, v in enumerate(REBREACH)]
    cut = restart_at or len(frames)
    changed = feed(sessions, AlertEngine(HOT), frames[:cut])
    changed += feed(sessions, AlertEngine(HOT), frames[cut:])  # a restarted collector
    got = alerts(sessions)
    assert len(got) == 1, [(a.fired_step, a.resolved_step) for a in got]
    a = got[0]
    assert (a.fired_step, a.state, a.resolved_step) == (30, "resolved", 130)
    assert a.evidence["reopened"] == 1 and a.evidence["last_breach_step"] == 70
    assert a.evidence["keep_firing_for"] == 50
    # what it showed when it fired stays; the re-breach is added, not written over it
    assert (a.value, a.threshold, a.paged_step) == (9.0, 5.0, 30)
    assert "loss = 9" in a.message and "fired at step 30" in a.message
    assert a.evidence["breaches"] == [{"step": 70, "value": 9.0, "baseline": None,
                                       "limit": 5.0}]
    assert a.evidence["latest"]["step"] == 70 and "breaches_dropped" not in a.evidence
    # people heard of it when it fired and when it resolved, not of the re-breach
    assert [(c.id, c.state) for c in changed] == [(a.id, "firing"), (a.id, "resolved")]


@pytest.mark.parametrize("restart_at", [None, 6])
def test_breach_beyond_hold_is_a_second_alert(sessions: sessionmaker[Session],
                                              restart_at: int | None) -> None:
    frames = [frame(i, loss=v) for i, v in enumerate(BEYOND)]
    cut = restart_at or len(frames)
    feed(sessions, AlertEngine(HOT), frames[:cut])
    feed(sessions, AlertEngine(HOT), frames[cut:])
    got = [(a.fired_step, a.state, a.resolved_step) for a in alerts(sessions)]
    assert got == [(30, "resolved", 90), (100, "firing", None)]


@pytest.mark.parametrize("restart_at", [None, 30])
def test_rebreaches_are_added_to_a_bounded_list(sessions: sessionmaker[Session],
                                                restart_at: int | None) -> None:
    series = [2, 2, 2, 9] + [2, 9] * 25 + [2] * 8  # fires at 30, 25 re-breaches, resolves
    frames = [frame(i, loss=v) for i, v in enumerate(series)]
    cut = restart_at or len(frames)
    feed(sessions, AlertEngine(HOT), frames[:cut])
    feed(sessions, AlertEngine(HOT), frames[cut:])  # a restarted collector
    (a,) = alerts(sessions)
    assert (a.fired_step, a.value, a.paged_step, a.state) == (30, 9.0, 30, "resolved")
    ev = a.evidence
    assert ev["reopened"] == 25 and ev["breaches_dropped"] == 5
    assert [b["step"] for b in ev["breaches"]] == list(range(150, 531, 20))
    assert ev["latest"]["step"] == ev["last_breach_step"] == 530
    assert ev["rule_kind"] == "threshold" and ev["keep_firing_for"] == 50


def test_head_that_rebreaches_keeps_its_layer_alert(sessions: sessionmaker[Session]) -> None:
    """A grouped per-head alert: a head that clears and breaches again within the hold
    stays in the same alert (active), with the newest value."""
    rule = RuleSpec("hot_head", "threshold", "attn.logit_max", params={"value": 50.0},
                    keep_firing_for=50)
    hot = [0, 0, 60, 60, 0, 0, 70, 0, 0, 0, 0, 0, 0, 0]

    def m(i: int) -> dict[str, Any]:
        return {"attn.logit_max": [[5.0, 5.0], [5.0, float(hot[i])]]}

    feed(sessions, AlertEngine([rule]), [frame(i, heads=m(i), loss=2.0)
                                         for i in range(len(hot))])
    got = alerts(sessions)
    assert len(got) == 1
    a = got[0]
    assert (a.layer, a.heads, a.fired_step, a.resolved_step) == (1, [1], 20, 120)
    assert a.value == 60.0 and a.evidence["reopened"] == 1  # the value it fired with
    assert [(b["step"], b["value"], b["heads"]) for b in a.evidence["breaches"]] == [
        (60, 70.0, [1])]
    assert a.evidence["latest"]["value"] == 70.0


# -- downgrade: a per-head logit departure in a wide attention dtype ----------------------

DEPARTURE = [r for r in DEFAULT_RULES if r.name == "attn_logit_departure"]


def _wide(i: int, *, dtype_max: float | None, loss: float = 2.0) -> dict[str, Any]:
    scalars: dict[str, Any] = {"loss": loss}
    if dtype_max is not None:
        scalars["attn.dtype_max"] = dtype_max
    # head (1, 2) doubles from sample 26: 80 > floor 50 at 29, firing (3 samples) at 31
    return frame(i, heads=logits(i, rising=((1, 2),), start=26), **scalars)


@pytest.mark.parametrize(("dtype_max", "severity"), [
    (65504.0, "warning"),  # float16 attention: on course to overflow
    (None, "warning"),  # the job does not say: as before
    (3.4028e38, "info"),  # float32: growth tends to stall learning, not overflow
])
def test_departure_severity_follows_attention_dtype(
        sessions: sessionmaker[Session], dtype_max: float | None, severity: str) -> None:
    feed(sessions, AlertEngine(DEPARTURE), [_wide(i, dtype_max=dtype_max) for i in range(34)])
    (a,) = alerts(sessions)
    assert (a.rule, a.layer, a.heads, a.fired_step) == ("attn_logit_departure", 1, [2], 310)
    assert a.severity == severity
    assert a.paged_step == (310 if severity == "warning" else None)
    if severity == "info":
        why = a.evidence["downgraded"]
        assert why["from"] == "warning" and why["value"] == 3.4028e38
        assert why["loss_rise"] == 0.0 and why["loss_rise_limit"] == 0.25
        assert "Info, not warning: attn.dtype_max = 3.403e+38" in a.message
        assert "stall learning rather than overflow" in a.message and "QK-clip" in a.message
    else:
        assert "downgraded" not in a.evidence


@pytest.mark.parametrize("restart_at", [None, 33])
def test_downgraded_alert_escalates_when_the_loss_rises(
        sessions: sessionmaker[Session], restart_at: int | None) -> None:
    # loss 2.0, then 2.2 (0.2 nat: below the 0.25-nat rise) from sample 28, then 3.5 from
    # sample 33: the median of the last 10 samples is 0.85 nat above its best once five of
    # them are at 3.5 (sample 37)
    frames = [_wide(i, dtype_max=3.4028e38, loss=2.0 if i < 28 else 2.2 if i < 33 else 3.5)
              for i in range(41)]
    cut = restart_at or len(frames)
    first = feed(sessions, AlertEngine(DEPARTURE), frames[:cut])
    later = feed(sessions, AlertEngine(DEPARTURE), frames[cut:])
    (a,) = alerts(sessions)
    assert a.severity == "warning" and a.fired_step == 310 and a.state == "firing"
    assert a.paged_step == 370 and a.evidence["escalated_step"] == 370
    # what it showed when it fired (as info) stays: head (1, 2) at sample 31 was 5 * 2**6
    assert a.value == 320.0 and a.message.startswith("r1: rank 0, layer 1, head 2: ")
    assert "fired at step 310." in a.message and "Info, not warning" in a.message
    assert "rose 0.85 nats above its best" in a.evidence["escalated_because"]
    assert "Escalated to warning at step 370" in a.message
    notified = [(c.id, c.severity) for c in first + later]
    assert notified == [(a.id, "info"), (a.id, "warning")]


# -- the whole-matrix screens decide exactly as the per-cell detectors ---------------------


def _replay_alerts(url: str, frames: list[dict[str, Any]], *, screen: bool,
                   restarts: int, rules: Any = None) -> list[tuple[Any, ...]]:
    engine = make_engine(url)
    try:
        migrate(engine)
        sessions = sessionmaker(engine, expire_on_commit=False)
        batches = [frames[i:i + 16] for i in range(0, len(frames), 16)]
        every = max(1, len(batches) // (restarts + 1))
        eng = AlertEngine(rules, screen=screen)
        for i, b in enumerate(batches):
            if i and i % every == 0 and restarts:
                eng = AlertEngine(rules, screen=screen)  # a restarted collector
            with session_scope(sessions) as s:
                stored = ingest_frames(s, IngestIn.model_validate({"frames": b}).frames)
                eng.process(s, stored.new_frames)
        with sessions() as s:
            return [(a.rule, a.severity, a.layer, a.heads, a.started_step, a.fired_step,
                     a.resolved_step, a.state, a.value, json.dumps(a.evidence, sort_keys=True))
                    for a in s.scalars(select(Alert).order_by(Alert.id))]
    finally:
        engine.dispose()


@pytest.mark.skipif(not (SCENARIOS / "fp32_growth.jsonl.gz").exists(),
                    reason="no recorded scenarios")
@pytest.mark.parametrize("name", ["attn_growth_s0", "fp32_growth", "qknorm_high_lr"])
def test_screened_engine_equals_per_cell_engine(tmp_path: Path, name: str) -> None:
    from logitwatch.server.alerts.replay import read_frames

    _, every_step = read_frames(SCENARIOS / f"{name}.jsonl.gz")
    # one frame in 10, as the job of this test samples them (the file has every step)
    frames = [{**f, "seq": i + 1} for i, f in enumerate(
        f for f in every_step if f["step"] % 10 == 0)]
    # a NaN/Inf cell in the middle of the run, as a broken head would send
    frames = json.loads(json.dumps(frames))
    mid = frames[len(frames) // 2]["heads"]["attn.logit_max"]
    mid[0][0], mid[1][1] = "NaN", "Infinity"
    # and a per-head departure with an additive margin (the screen's other limit form)
    # (every default on, the screened kinds that are off by default included)
    rules = [*(dataclasses.replace(r, enabled=True) for r in DEFAULT_RULES),
             RuleSpec("logit_margin", "departure", "attn.logit_max",
                      params={"margin": 10.0, "floor": 0.0})]
    for restarts in (0, 2):  # a restart rebuilds from the stored (float32) values
        ref = _replay_alerts(f"sqlite:///{tmp_path / f'a{restarts}.db'}", frames,
                             screen=False, restarts=restarts, rules=rules)
        got = _replay_alerts(f"sqlite:///{tmp_path / f'b{restarts}.db'}", frames,
                             screen=True, restarts=restarts, rules=rules)
        assert got == ref
        assert {"attn_logit_departure", "attn_p99_trend", "logit_margin"} <= {r[0] for r in ref}
        margin = next(r for r in ref if r[0] == "logit_margin")
        assert "above_baseline" in json.loads(margin[-1]) and margin[2] is not None


def test_a_rule_that_raises_is_skipped_and_ingest_goes_on(
        sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    # a rule the validation cannot see through (a detector that raises on this data)
    bad = RuleSpec("bad", "threshold", "loss", params={"value": 5.0})
    object.__setattr__(bad, "params", {"value": "not a number"})
    good = RuleSpec("hot_loss", "threshold", "loss", params={"value": 5.0})
    engine = AlertEngine([bad, good])
    with caplog.at_level(logging.ERROR, logger="logitwatch.alerts"):
        feed(sessions, engine, [frame(i, loss=v) for i, v in enumerate([2, 9, 9, 2])])
    got = alerts(sessions)
    assert [(a.rule, a.fired_step) for a in got] == [("hot_loss", 10)]
    failed = [r for r in caplog.records if "alert rule 'bad' failed" in r.getMessage()]
    assert len(failed) == 1  # logged once, then skipped
    engine.set_rules([good])  # replacing the rules gives it a fresh start
    assert engine._broken == set()


def test_a_stored_rule_this_version_refuses_is_left_out(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # a rule stored by an older collector, before params were checked
    with TestClient(create_app(Settings(db_url=sqlite_url))):
        pass
    engine = make_engine(sqlite_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            s.add(AlertRule(name="old_bad", spec={"name": "old_bad", "kind": "departure",
                                                  "metric": "loss",
                                                  "params": {"factor": "x"}},
                            updated_at=1.0))
    finally:
        engine.dispose()
    with caplog.at_level(logging.ERROR, logger="logitwatch.alerts"), \
            TestClient(create_app(Settings(db_url=sqlite_url))) as c:  # it starts
        assert "stored alert rule 'old_bad' is not used" in caplog.text
        r = c.put("/api/v1/alerts/rules/big_loss",
                  json={"kind": "threshold", "metric": "loss", "params": {"value": 8.0}})
        assert r.status_code == 200, r.text
        names = {x["name"] for x in c.get("/api/v1/alerts/rules").json()}
        assert "big_loss" in names and "old_bad" not in names
        frame0 = {"run": "r", "seq": 1, "step": 0, "time": 1.0, "scalars": {"loss": 9.0}}
        assert c.post("/api/v1/ingest", json={"frames": [frame0]}).status_code == 200
        # replacing it through the API makes it a rule again
        r = c.put("/api/v1/alerts/rules/old_bad",
                  json={"kind": "departure", "metric": "loss", "params": {"factor": 3.0}})
        assert r.status_code == 200, r.text
        assert "old_bad" in {x["name"] for x in c.get("/api/v1/alerts/rules").json()}


def _sgd_warm_up(i: int) -> dict[str, Any]:
    """Frame ``i`` (step 10·i) of a momentum-SGD job warming its LR up to step 800, float32
    scores, a flat loss; head (1, 2)'s max logit grows e-fold every 50 steps from step 400."""
    step = i * 10
    m = [[5.0 + 0.1 * ((i + h) % 3) for h in range(4)] for _ in range(2)]
    if step >= 400:
        m[1][2] = 5.0 * 2.718281828 ** ((step - 400) / 50)
    return frame(i, heads={"attn.logit_max": m}, loss=3.0 + 0.05 * ((i * 7) % 3),
                 lr=3.0 * (step + 1) / 800, **{"attn.dtype_max": 3.4e38, "optim.adaptive": 0.0})


@pytest.mark.parametrize("restart_at", [None, 50])
def test_the_lr_climb_survives_a_restart(sessions: sessionmaker[Session],
                                         restart_at: int | None) -> None:
    """A wide-dtype departure under a plain optimizer whose LR still climbs pages when it
    fires, also when the collector restarted 30 steps before: the LR it climbed from is
    rebuilt from the stored frames (without them the climb over 500-530 is 6 %, and the
    departure would be info). The departure alone: the defaults' loss_jump reads the LR
    too, and would restore it anyway."""
    rules = [r for r in DEFAULT_RULES if r.name == "attn_logit_departure"]
    frames = [_sgd_warm_up(i) for i in range(70)]
    cut = restart_at or len(frames)
    feed(sessions, AlertEngine(rules), frames[:cut])
    feed(sessions, AlertEngine(rules), frames[cut:])  # a restarted collector
    (a,) = [a for a in alerts(sessions) if a.rule == "attn_logit_departure"]
    assert a.severity == "warning" and a.paged_step == a.fired_step, a.evidence
    assert 510 <= a.fired_step <= 560 and "downgraded" not in a.evidence
