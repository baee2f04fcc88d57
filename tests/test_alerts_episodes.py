"""The alert engine over a real database, one episode at a time: a re-breach within a rule's
hold is the same alert (also across a collector restart), a per-head departure's severity
follows the attention dtype and escalates when the loss rises, and an LR climb survives a
restart."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.db.models import Frame
from logitwatch.server.db.session import session_scope
from tests.alert_frames import alerts, feed, frame, logits

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


@pytest.mark.parametrize("restart_at", [None, 430])
def test_the_loss_guard_of_a_log_z_ramp_survives_a_restart(sessions: sessionmaker[Session],
                                                           restart_at: int | None) -> None:
    """log Z ramping 0.1 nat a step from step 400 with the loss creeping up is paged on its
    short level at 446 (round thirty-five), also when the collector restarted at 430: the
    loss its guard reads is rebuilt from the stored frames though no other rule of the set
    reads the loss (without it the guard cannot be read, and the ramp waits for its 100-step
    level, at 459)."""
    import random

    from tests.alert_frames import frames_at

    rules = [r for r in DEFAULT_RULES if r.name == "final_logz_departure"]
    noise = random.Random(1)
    wander = [noise.gauss(0.0, 0.1) for _ in range(800)]

    def ramp(step: int) -> dict[str, float]:
        up = max(0, step - 400)
        return {"loss": 2.5 + 0.01 * up, "final.logz": 6.0 + wander[step] + 0.1 * up}

    frames = frames_at(1, 600, ramp)
    cut = restart_at or len(frames)
    feed(sessions, AlertEngine(rules), frames[:cut])
    feed(sessions, AlertEngine(rules), frames[cut:])  # a restarted collector
    (a,) = [a for a in alerts(sessions) if a.rule == "final_logz_departure"]
    assert a.fired_step == 446 and a.evidence.get("running_away"), (a.fired_step, a.evidence)


# -- what a replay of the newest frames cannot rebuild (rule_memory) -----------------------

GN_RISING = [RuleSpec("gn_rising", "level_rise", "grad.norm", severity="warning",
                      params={"window": 20, "factor": 3.0, "min_history": 50})]


def _gn(step: int) -> dict[str, float]:
    """The gradient norm settles to 0.5 (steps 100-199), sits at 1.2 for 700 steps (2.4x
    its lowest level: under the rule's 3x), then rises to 1.6 at step 900 (3.2x)."""
    return {"grad.norm": 1.0 if step < 100 else 0.5 if step < 200 else
            1.2 if step < 900 else 1.6}


@pytest.mark.parametrize("restart_at", [None, 850])
def test_the_lowest_settled_level_survives_a_restart(sessions: sessionmaker[Session],
                                                     restart_at: int | None) -> None:
    """A restart replays the newest 400 frames: the lowest level the gradient norm settled
    to (0.5, 650 steps before) is not among them. Rebuilt from them it read 1.2, and the
    rise to 3.2x its lowest level at step 900 never fired (a level_rise that had fired
    resolved at a restart and fired again, paging twice). The engine keeps it in
    rule_memory, with the batch that set it."""
    from tests.alert_frames import frames_at

    frames = frames_at(1, 960, _gn)
    cut = restart_at or len(frames)
    feed(sessions, AlertEngine(GN_RISING), frames[:cut])
    feed(sessions, AlertEngine(GN_RISING), frames[cut:])  # a restarted collector
    got = [(a.rule, a.fired_step, a.evidence["lowest_level"]) for a in alerts(sessions)]
    assert got == [("gn_rising", 910, 0.5)]


def test_an_old_spool_pushed_late_is_stored_not_judged(sessions: sessionmaker[Session]) -> None:
    """Frames sent before those already judged (their seq is lower: an old spool pushed
    after newer frames) were judged against the newer memory: an LR of 0.01 after 0.5 was
    a jump, the alert reopened and never resolved. They are stored only, and the (run,
    rank) is rebuilt from the store in step order when it sends again."""
    from tests.alert_frames import frames_at

    rules = [r for r in DEFAULT_RULES if r.name == "lr_jump"]
    frames = frames_at(1, 260, lambda s: {"lr": 0.01 if s < 200 else 0.5, "loss": 3.0})
    feed(sessions, AlertEngine(rules), frames[:100] + frames[150:240])
    engine = AlertEngine(rules)
    feed(sessions, engine, frames[240:250])
    feed(sessions, engine, frames[100:150])  # the late spool
    feed(sessions, engine, frames[250:])
    got = [(a.rule, a.fired_step, a.evidence.get("reopened")) for a in alerts(sessions)]
    assert got == [("lr_jump", 200, None)]
    with session_scope(sessions) as s:
        assert s.scalar(select(func.count()).select_from(Frame)) == 260  # all stored


def test_one_run_level_event_pages_once_whatever_the_ranks(
        sessions: sessionmaker[Session]) -> None:
    """Ranks that each send their own frames (``reduce_ranks=False``) share the LR, the
    global gradient norm and the clip: one LR jump paged once per rank. The first rank's
    alert pages; the others are stored ``suppressed: "duplicate"`` (naming it) while it
    fires, and are not notified."""
    from tests.alert_frames import frames_at

    rules = [r for r in DEFAULT_RULES if r.name == "lr_jump"]
    one = frames_at(1, 260, lambda s: {"lr": 0.01 if s < 200 else 0.5, "loss": 3.0})
    frames = [{**f, "rank": rank} for f in one for rank in range(4)]
    changed = feed(sessions, AlertEngine(rules), frames)
    got = sorted((a.rank, a.fired_step, a.suppressed) for a in alerts(sessions))
    assert got == [(0, 200, None), (1, 200, "duplicate"), (2, 200, "duplicate"),
                   (3, 200, "duplicate")]
    first = [a.id for a in alerts(sessions) if a.rank == 0]
    assert {a.evidence["duplicate_of"]["alert"] for a in alerts(sessions) if a.rank} == set(first)
    assert [(c.rank, c.state) for c in changed] == [(0, "firing")]


def _clocked(step: int, seq: int, loss: float) -> dict[str, object]:
    return {"run": "r", "rank": 0, "seq": seq, "step": step, "time": 1000.0 + step,
            "scalars": {"loss": loss}, "heads": {}}


def test_a_job_resumed_on_a_host_whose_clock_is_behind_is_judged(
        sessions: sessionmaker[Session]) -> None:
    """Seqs follow the job's clock: resumed 30 s after its last frame on a host whose
    clock is 10 minutes behind, a job numbers its frames below its first life's. Its steps
    past the newest judged one are judged (skipped as an old spool, its loss blowing up at
    step 300 went unseen: review)."""
    hot = [RuleSpec("hot_loss", "threshold", "loss", params={"value": 5.0})]
    t1 = 1_700_000_000_000_000
    first = [_clocked(s, t1 + s * 1_000_000, 2.0) for s in range(0, 200, 10)]
    t0 = t1 + 190 * 1_000_000 + 30_000_000 - 600_000_000
    resumed = [_clocked(s, t0 + (s - 200) * 1_000_000, 9.0 if s >= 300 else 2.0)
               for s in range(200, 400, 10)]
    engine = AlertEngine(hot)
    feed(sessions, engine, first)
    feed(sessions, engine, resumed)
    assert [(a.rule, a.fired_step) for a in alerts(sessions)] == [("hot_loss", 300)]


def test_a_run_under_a_deleted_runs_id_is_judged_afresh(sessions: sessionmaker[Session]) -> None:
    """SQLite gives a deleted run's id to the next run: the engine's memory of the old run
    (its newest seq and step) made every frame of the new one late, never judged; its NaN
    loss went unseen (review). The run's creation time tells them apart."""
    from logitwatch.server.db.models import Run
    from logitwatch.server.store.queries import delete_run

    def fr(run: str, i: int, loss: float) -> dict[str, object]:
        return {"run": run, "rank": 0, "seq": i + 1, "step": i * 10, "time": 1000.0 + i,
                "scalars": {"loss": loss}, "heads": {}}

    engine = AlertEngine()
    feed(sessions, engine, [fr("old", i, 2.0) for i in range(50)])
    with session_scope(sessions) as s:
        delete_run(s, s.scalar(select(Run.id).where(Run.name == "old")))
    feed(sessions, engine, [fr("new", i, 2.0) for i in range(5)])
    got = feed(sessions, engine, [fr("new", i, float("nan")) for i in range(5, 10)])
    assert [(a.rule, a.state) for a in got] == [("loss_nonfinite", "firing")]


def test_the_whole_run_memory_of_a_changed_rule_is_not_read_back(
        sessions: sessionmaker[Session]) -> None:
    """A rule of the same name retargeted (``set_rules``, the rules API, an edited rules
    file and a restart): the lowest level it had settled to on its old series was put back
    into the new one, and a flat series at 10 fired as 10x "its" lowest level, 1 (review).
    Each entry carries its rule's fingerprint; another rule's is not read back."""
    p = {"window": 5, "factor": 3.0, "min_history": 5, "min_samples": 3}

    def fr(i: int) -> dict[str, object]:
        return {"run": "r", "rank": 0, "seq": i + 1, "step": i, "time": 1000.0 + i,
                "scalars": {"a": 1.0, "b": 10.0}, "heads": {}}

    engine = AlertEngine([RuleSpec("rise", "level_rise", "a", params=p, severity="warning")])
    feed(sessions, engine, [fr(i) for i in range(40)])
    engine.set_rules([RuleSpec("rise", "level_rise", "b", params=p, severity="warning")])
    assert feed(sessions, engine, [fr(i) for i in range(40, 60)]) == []
    assert alerts(sessions) == []
