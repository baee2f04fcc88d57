"""The alert engine over a real database: lifecycle, restart-resume, grouping, inhibition,
silences, no data, the persistent webhook outbox, the alerts API and the CLI, the screens
against the per-cell detectors, rules that fail. One episode at a time (holds, dtype
downgrades, the LR climb after a restart): test_alerts_episodes.py."""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import math
import time
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
from tests.alert_frames import alerts, feed, frame, frames_at, growing, logits, plateau_loss
from tests.webhook_tools import WebhookReceiver

SCENARIOS = Path(__file__).resolve().parent.parent / "bench" / "scenarios"


def _scenario_header(name: str) -> dict[str, Any]:
    """The header line of a recorded scenario (``bench/scenarios/<name>.jsonl.gz``)."""
    with gzip.open(SCENARIOS / f"{name}.jsonl.gz", "rt") as fh:
        return json.loads(fh.readline())
#: The defaults with attn_logit_rising on (off by default): the simplest per-head rule, the
#: subject of the lifecycle tests below
RULES = [dataclasses.replace(r, enabled=True) if r.name == "attn_logit_rising" else r
         for r in DEFAULT_RULES]


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


def test_webhook_retries_survive_a_collector_restart(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    probe = WebhookReceiver()  # a free port; nothing listens on it yet: deliveries fail
    port, url = probe.port, probe.url  # and wait in the outbox
    probe.server.server_close()
    eng = AlertEngine(RULES)
    feed(sessions, eng, [frame(i, heads=logits(i, rising=((0, 1),)), loss=2.0)
                         for i in range(25)])
    with sessions() as s:
        a = next(a for a in s.scalars(select(Alert)) if a.rule == "attn_logit_rising")
        run = s.get(Run, a.run_id)
        assert run is not None
        out = alert_out(a, run)
    first = WebhookNotifier(url, retries=50, sessions=sessions, base_delay=0.05,
                             info=True)  # this rule set's alert is info
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
    with WebhookReceiver(port) as hook:
        second = WebhookNotifier(url, retries=50, sessions=sessions, base_delay=0.05,
                                 info=True)
        try:
            deadline = time.time() + 15
            while time.time() < deadline and not hook.received:
                time.sleep(0.05)
        finally:
            second.close()
            engine.dispose()
    assert len(hook.received) == 1
    body = hook.received[0]
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


def test_screened_and_per_cell_engines_judge_the_capped_scores_alike(tmp_path: Path) -> None:
    """Under a soft-cap of 1,000 a head's capped scores depart: the screened and the per-cell
    path fire the same departure on the capped series, and the forecast reads it too."""
    grow = growing(300, rate=0.01)

    def heads(step: int) -> dict[str, Any]:
        raw = grow(step)["attn.logit_max"]
        return {"attn.logit_max": raw,
                "attn.capped_logit_max": [[1000.0 * math.tanh(x / 1000.0) for x in row]
                                          for row in raw]}

    frames = frames_at(10, 800, lambda s: {"loss": plateau_loss(s)}, heads)
    ref = _replay_alerts(f"sqlite:///{tmp_path / 'a.db'}", frames, screen=False, restarts=0)
    got = _replay_alerts(f"sqlite:///{tmp_path / 'b.db'}", frames, screen=True, restarts=0)
    assert got == ref
    judged = {r[0] for r in ref if json.loads(r[-1]).get("judged_metric")
              == "attn.capped_logit_max"}
    assert {"attn_logit_departure", "attn_logit_forecast"} <= judged, ref


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


def test_one_runs_values_never_switch_a_rule_off_for_the_others(
        sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    """A run whose LR was negative, then positive at a loss jump: ``loss_jump`` took the log
    of their ratio and raised, and the rule was skipped for every run of the collector, so
    the next run's divergence paged nothing. Now the LR change is judged on positive values
    only, and a rule that raises is skipped for that run and rank alone."""
    engine = AlertEngine(DEFAULT_RULES)

    def job(run: str, lr_before: float) -> list[dict]:
        return [{"run": run, "rank": 0, "seq": s + 1, "step": s, "time": 1000.0 + s,
                 "scalars": {"loss": (2.0 if s < 80 else 10.0) + 0.01 * (s % 3),
                             "lr": lr_before if s < 80 else 0.001, "grad.norm": 1.0},
                 "heads": {}} for s in range(200)]

    with caplog.at_level(logging.ERROR, logger="logitwatch.alerts"):
        feed(sessions, engine, job("evil", -0.001))
        feed(sessions, engine, job("victim", 0.001))
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    by_run = {(a.rule, a.run_id) for a in alerts(sessions)}
    assert {r for r, _ in by_run if r == "loss_jump"} and len(
        {run for rule, run in by_run if rule == "loss_jump"}) == 2, by_run
    # a rule that raises on one run's data is skipped there only
    bad = RuleSpec("bad", "threshold", "loss", params={"value": 5.0})
    object.__setattr__(bad, "params", {"value": "not a number"})
    engine.set_rules([bad])
    engine._advance(1, 0, 500, {"loss": 9.0}, {})
    assert engine._broken == {("bad", 1, 0)}
    # kept per (run, rank) like the rest of its state: forgotten when that rank is evicted
    engine._evict([(1, 0)], now=0.0)
    engine._evict([], now=1e9)  # idle for longer than idle_seconds
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
