"""The paging policy and rules in steps, through the real ingest and engine (SQLite):

* the same rule means the same at any sampling interval (windows, lags, histories and
  persistence count steps; per-head statistics are judged at most once every 10 steps);
* a wide-dtype departure is ``info`` until the loss shows harm that it is not winning back,
  or while a plain optimizer's LR still climbs;
* overflow is judged on what the softmax receives: a soft-capped attention whose raw logits
  run away is not forecast to overflow, and its departure is ``info``;
* baselines of the final layer's series.

The loss's and the gradient norm's own paging (bumps, blow-ups, the clip threshold):
``test_alerts_policy_scalars.py``; the loss-jump policy (bumps that come back, garbage
batches, blow-ups): ``test_alerts_loss_jump.py``; the warm-up ramp rules on the loss:
``test_alerts_ramps.py``; a bump's recovery judged on its level: ``test_alerts_recovery.py``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.schemas import AlertOut
from tests.alert_frames import (
    FP16,
    alerts_of,
    by_rule,
    defaults_with,
    frames_at,
    growing,
    plateau_loss,
)


def test_departure_means_the_same_at_every_interval() -> None:
    """A head whose max logit grows from step 600: the departure fires within one sampling
    interval of the same step whether the job samples every step, every 10 or every 40."""
    fired = {}
    for k in (1, 10, 40):
        alerts = alerts_of(frames_at(k, 900, lambda s: {"loss": plateau_loss(s),
                                                         "attn.dtype_max": FP16},
                                     growing(600)))
        dep = by_rule(alerts, "attn_logit_departure")
        assert len(dep) == 1, (k, [(a.rule, a.fired_step) for a in alerts])
        assert dep[0].layer == 1 and dep[0].head == 2 and dep[0].severity == "warning"
        fired[k] = dep[0].fired_step
    # floor 50 = 5 * e^(0.02 t) at t = 115: step 715, judged on a 10-step grid (or the
    # interval), then for_steps 20
    for k, step in fired.items():
        assert 715 + 20 <= step <= 715 + 20 + 2 * max(k, 10), fired
    assert fired[1] == fired[10] and fired[40] - fired[1] <= 40, fired


def test_departure_history_needed_is_in_steps() -> None:
    """At interval 40 the departure judges once the series has its 200 steps of history
    (not 20 samples = 800 steps, as a rule counted in samples would need)."""
    alerts = alerts_of(frames_at(40, 700,
                                 lambda s: {"loss": plateau_loss(s), "attn.dtype_max": FP16},
                                 growing(320, rate=0.03)))
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and dep[0].fired_step < 600, [(a.rule, a.fired_step) for a in alerts]


F32 = 3.4028e38


def _departure_with(loss: Any, recover_span: Any = "default") -> list[AlertOut]:
    """Every step's loss (history at interval 10) and a float32 attention whose head (1, 2)
    grows from step 400 (5.0 -> past the floor 50 by 516): the departure alerts."""
    rules = None
    if recover_span != "default":
        rules = [dataclasses.replace(r, downgrade=dataclasses.replace(
            r.downgrade, recover_span=recover_span,
            start_rise=None if recover_span is None else r.downgrade.start_rise))
            if r.name == "attn_logit_departure" else r for r in DEFAULT_RULES]
    frames = frames_at(10, 760, lambda s: {"loss": loss(s), "attn.dtype_max": F32},
                       growing(400), history=True)
    return by_rule(alerts_of(frames, rules), "attn_logit_departure")


def _garbage_then_recovery(step: int) -> float:
    """20 steps of garbage batches from 430 (loss 7), then the loss wins its ground back:
    1.5 nats up at 450, a third of that every 40 steps."""
    if 430 <= step < 450:
        return 7.0 + plateau_loss(step)
    if step >= 450:
        return plateau_loss(step) + 1.5 * math.exp(-(step - 450) / 40)
    return plateau_loss(step)


def test_a_wide_dtype_departure_does_not_page_on_a_bump_being_recovered() -> None:
    """Round nineteen: in a wide dtype the departure pages once the loss gives back ground;
    a bad-data bump's loss, still up but winning it back (its newest 20 steps' median below
    the 20 before), is the loss rules' to judge: the departure stays info."""
    (a,) = _departure_with(_garbage_then_recovery)
    assert a.severity == "info" and a.paged_step is None, (a.fired_step, a.evidence)
    why = a.evidence["downgraded"]
    assert why["loss_recovering"] is True and why["loss_rise"] >= 0.25, why
    assert "is winning it back" in a.message
    assert why["loss_won_back"] >= 0.5
    # without the recovery test the same run pages on the bump's rise
    (b,) = _departure_with(_garbage_then_recovery, recover_span=None)
    assert b.severity == "warning" and b.paged_step == b.fired_step
    assert "downgraded" not in b.evidence  # the bump's rise counted when it fired


def test_each_downgrade_judges_the_recovery_by_its_own_share() -> None:
    """Two departures over the same loss window and span, one asking half the bump won back
    (the default) and one all of it: they read one loss tracker, and each compares what it
    says with its own ``recover_share``: the default stays info, the strict one pages (both
    judge the rise from the run's best alone, ``start_rise`` null: the garbage batches'
    rise came before the logits left their range, which holds both by default)."""
    rules = _with_start_rise(None)
    dep = next(r for r in rules if r.name == "attn_logit_departure")
    assert dep.downgrade is not None
    strict = dataclasses.replace(dep, name="attn_logit_departure_strict", downgrade=(
        dataclasses.replace(dep.downgrade, recover_share=1.0)))
    frames = frames_at(10, 760, lambda s: {"loss": _garbage_then_recovery(s),
                                           "attn.dtype_max": F32}, growing(400), history=True)
    (c,) = by_rule(alerts_of(frames, [*DEFAULT_RULES, dataclasses.replace(
        strict, downgrade=dataclasses.replace(strict.downgrade, start_rise=0.0))]),
        "attn_logit_departure_strict")
    assert c.severity == "info" and c.evidence["downgraded"]["loss_before"] is True
    alerts = alerts_of(frames, [*rules, strict])
    (a,) = by_rule(alerts, "attn_logit_departure")
    (b,) = by_rule(alerts, "attn_logit_departure_strict")
    assert a.severity == "info" and a.paged_step is None
    assert b.severity == "warning" and b.paged_step is not None


def test_a_wide_dtype_departure_pages_when_the_loss_keeps_losing_ground() -> None:
    """The same logits with the loss climbing 0.005 nat a step from 450: it pages."""
    (a,) = _departure_with(lambda s: plateau_loss(s) + 0.005 * max(0, s - 450))
    assert a.severity == "warning" and a.paged_step is not None
    assert a.paged_step <= 560, (a.fired_step, a.paged_step)  # 0.25 nat by 550 (+ a median)


def _with_start_rise(rise: float | None) -> list[RuleSpec]:
    return [dataclasses.replace(r, downgrade=dataclasses.replace(r.downgrade, start_rise=rise))
            if r.name == "attn_logit_departure" else r for r in DEFAULT_RULES]


def _up_before(climb_from: int | None = None,  # type: ignore[no-untyped-def]
               tau: float = 400.0):
    """An LR bump at step 470 leaves the loss 0.6 nat up, coming down with time constant
    ``tau`` (400: a fifth of it in 90 steps): up already when the head growing from 400
    passes the floor 50 (516); with ``climb_from`` the loss then climbs 0.005 nat a step
    from that step."""
    def loss(step: int) -> float:
        v = plateau_loss(step) + (0.6 * math.exp(-(step - 470) / tau) if step >= 470 else 0)
        return v + (0.005 * (step - climb_from) if climb_from and step >= climb_from else 0)
    return loss


def test_a_wide_dtype_departure_does_not_page_on_a_loss_up_before_it_started() -> None:
    """Round forty: the loss rose 0.6 nat for another cause before the logits left their
    range and is no higher since: ``start_rise`` holds the departure at info, where without
    it the same run pages when the departure fires (the loss neither back at its best nor
    winning half the bump back). A loss that then climbs past its level at the start pages,
    and the escalation says how far it climbed since."""
    frames = frames_at(10, 760, lambda s: {"loss": _up_before()(s), "attn.dtype_max": F32},
                       growing(400), history=True)
    (a,) = by_rule(alerts_of(frames, _with_start_rise(0.0)), "attn_logit_departure")
    assert a.severity == "info" and a.paged_step is None, (a.fired_step, a.evidence)
    why = a.evidence["downgraded"]
    assert why["loss_before"] is True and why["loss_rise"] >= 0.25, why
    assert why["loss_since_start"] < 0 and why["started_step"] == a.started_step, why
    assert why["loss_level_at_start"] > 3.4, why
    assert "was up already when the episode started" in a.message, a.message
    (b,) = by_rule(alerts_of(frames, _with_start_rise(None)), "attn_logit_departure")
    assert b.severity == "warning" and b.paged_step == b.fired_step == a.fired_step
    climbing = frames_at(10, 760, lambda s: {"loss": _up_before(600)(s),
                                             "attn.dtype_max": F32}, growing(400), history=True)
    (c,) = by_rule(alerts_of(climbing, _with_start_rise(0.1)), "attn_logit_departure")
    assert c.fired_step == a.fired_step and c.paged_step is not None, c.evidence
    # the level (a 20-step median, 10 steps behind) comes 0.1 nat above its start ~60 steps
    # into the climb (it had come down 0.1 nat by then); judged every 10 steps
    assert 650 <= c.paged_step <= 680, c.paged_step
    assert "nats above where it was when the episode started" in c.evidence[
        "escalated_because"], c.evidence


def test_the_default_start_rise_tolerates_the_levels_noise() -> None:
    """Round forty-one: the default ``start_rise`` is -0.05, a tolerance for the 20-step
    level's batch noise. A bump healing with time constant 100 (its level 0.07 nat under
    the start's by the time the departure fires, not yet half won back) holds the departure
    at info; the slow one above (0.02 under) pages with the default and is held at 0."""
    rules = {r.name: r for r in DEFAULT_RULES}
    assert rules["attn_logit_departure"].downgrade.start_rise == -0.05
    healing = frames_at(10, 760, lambda s: {"loss": _up_before(tau=100.0)(s),
                                            "attn.dtype_max": F32}, growing(400), history=True)
    (a,) = by_rule(alerts_of(healing), "attn_logit_departure")
    assert a.severity == "info" and a.paged_step is None, (a.fired_step, a.evidence)
    why = a.evidence["downgraded"]
    assert why["loss_before"] is True and -0.1 < why["loss_since_start"] < -0.05, why
    assert "its level back within 0.05 nats of that makes it a warning" in a.message
    (b,) = by_rule(alerts_of(healing, _with_start_rise(None)), "attn_logit_departure")
    assert b.severity == "warning" and b.paged_step == b.fired_step == a.fired_step
    slow = frames_at(10, 760, lambda s: {"loss": _up_before()(s), "attn.dtype_max": F32},
                     growing(400), history=True)
    (c,) = by_rule(alerts_of(slow), "attn_logit_departure")
    assert c.severity == "warning" and c.paged_step == c.fired_step, c.evidence


def _warming_up(until: int, peak: float = 3.0,  # type: ignore[no-untyped-def]
                adaptive: float = 0.0):
    """A flat loss under an LR that climbs linearly to ``peak`` until step ``until``, with
    a plain optimizer (``adaptive`` 0.0, SGD) or an adaptive one (1.0, Adam)."""
    def scalars(step: int) -> dict[str, float]:
        return {"loss": plateau_loss(step), "attn.dtype_max": F32, "optim.adaptive": adaptive,
                "lr": peak * min(1.0, (step + 1) / until)}
    return scalars


def _with_lr_climb(climb: float | None) -> list[RuleSpec]:
    return [dataclasses.replace(r, downgrade=dataclasses.replace(r.downgrade, lr_climb=climb))
            if r.name == "attn_logit_departure" else r for r in DEFAULT_RULES]


def test_a_wide_dtype_departure_pages_while_the_lr_still_climbs() -> None:
    """A float32 attention whose head grows from step 400 under a flat loss: while a plain
    optimizer's LR is still warming up (to step 800) the departure pages when it fires (an
    SGD run blows up with its logits before the loss shows it); the same logits after the
    warm-up ended (step 300), under an adaptive optimizer, or without ``lr_climb`` stay
    info."""
    climbing = frames_at(10, 700, _warming_up(800), growing(400), history=True)
    (a,) = by_rule(alerts_of(climbing), "attn_logit_departure")  # the defaults (0.2)
    assert a.severity == "warning" and a.paged_step == a.fired_step, a.evidence
    assert 510 <= a.fired_step <= 540, a.fired_step
    assert "downgraded" not in a.evidence and a.evidence["kept_severity"]["lr_climb"] >= 0.2
    assert "Not lowered in a wide dtype: the learning rate of a plain optimizer is still " \
        "climbing" in a.message, a.message
    (b,) = by_rule(alerts_of(climbing, _with_lr_climb(None)), "attn_logit_departure")
    assert b.severity == "info" and b.paged_step is None
    assert b.evidence["downgraded"]["loss_rise"] < 0.25
    flat = frames_at(10, 700, _warming_up(300), growing(400), history=True)
    (c,) = by_rule(alerts_of(flat), "attn_logit_departure")
    assert c.severity == "info" and c.paged_step is None, c.evidence
    assert c.fired_step == a.fired_step
    assert "kept_severity" not in c.evidence and "Not lowered" not in c.message
    adam = frames_at(10, 700, _warming_up(800, adaptive=1.0), growing(400), history=True)
    (d,) = by_rule(alerts_of(adam), "attn_logit_departure")
    assert d.severity == "info" and d.paged_step is None, d.evidence


def test_a_downgraded_departure_escalates_when_the_lr_starts_climbing() -> None:
    """Info while the LR is flat; a second warm-up from step 600 (20 % up by 610) lifts the
    downgrade, and the escalation says why."""
    def scalars(step: int) -> dict[str, float]:
        lr = 1.0 if step < 600 else 1.0 + 0.02 * (step - 600)
        return {"loss": plateau_loss(step), "attn.dtype_max": F32, "lr": lr, "optim.adaptive": 0.0}
    frames = frames_at(10, 700, scalars, growing(400), history=True)
    (a,) = by_rule(alerts_of(frames), "attn_logit_departure")
    assert a.fired_step < 600 and a.paged_step is not None and 610 <= a.paged_step <= 620
    assert "plain optimizer is still climbing" in a.evidence["escalated_because"], a.evidence


def _capped(grow: Any, cap: float) -> Any:  # the heads of a model that soft-caps at ``cap``
    def heads(step: int) -> dict[str, Any]:
        raw = grow(step)["attn.logit_max"]
        capped = [[cap * math.tanh(x / cap) for x in row] for row in raw]
        return {"attn.logit_max": raw, "attn.capped_logit_max": capped}
    return heads


def test_softcapped_scores_cannot_overflow() -> None:
    """Raw logits grow to 1e6 in a float16 attention, but the model soft-caps its scores at
    50: what the softmax receives never leaves its range, so no forecast of an overflow and
    no departure, not even an info one."""
    grow = growing(300, rate=0.03)
    alerts = alerts_of(frames_at(10, 800,
                                 lambda s: {"loss": plateau_loss(s), "attn.dtype_max": FP16},
                                 _capped(grow, 50.0)))
    assert not by_rule(alerts, "attn_logit_forecast")
    assert not by_rule(alerts, "attn_logit_departure"), \
        [(a.severity, a.fired_step, a.value) for a in by_rule(alerts, "attn_logit_departure")]
    # without the cap, the same raw logits page (forecast or departure)
    plain = alerts_of(frames_at(10, 800,
                                lambda s: {"loss": plateau_loss(s), "attn.dtype_max": FP16},
                                grow))
    assert [a for a in plain if a.severity == "warning"]


def test_a_departure_under_a_high_cap_is_judged_on_the_capped_scores() -> None:
    """A cap of 1,000 leaves the scores free up to a few hundred: the capped scores depart
    as the raw ones do, and the alert names the series it read (in a wide dtype: info)."""
    alerts = alerts_of(frames_at(10, 800, lambda s: {"loss": plateau_loss(s)},
                                 _capped(growing(300, rate=0.01), 1000.0)))
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep, [(a.rule, a.fired_step) for a in alerts]
    a = dep[0]
    assert a.evidence["judged_metric"] == a.metric == "attn.capped_logit_max"
    assert "attn.capped_logit_max = " in a.message
    assert 50.0 < a.value < 1000.0  # a capped score, past the departure's floor


def test_per_head_judged_at_most_every_ten_steps() -> None:
    """Every-step per-head frames cost the engine what a 1-in-10 sampling does: the
    departure's evidence shows a baseline window of ~20 samples, not 200."""
    alerts = alerts_of(frames_at(1, 900,
                                 lambda s: {"loss": plateau_loss(s), "attn.dtype_max": FP16},
                                 growing(600)), rules=DEFAULT_RULES)
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and dep[0].fired_step % 10 == 0


def test_a_burst_of_samples_does_not_move_a_final_layer_baseline() -> None:
    """Every 40 steps, and four samples in steps 400-421 (the hooks sample the steps after
    a loss spike) on batches of padding, whose hidden state is 0 and whose logits are
    uniform: the final-layer departures weigh each sample by the steps it stands for, so
    the burst does not become the baseline the clean samples after it depart from."""
    steps = [*range(0, 401, 40), 401, 411, 421, *range(461, 800, 40)]  # the grid moves on

    def scalars(step: int) -> dict[str, float]:
        pad = 400 <= step < 430
        return {"loss": 5.545 if pad else 1.9 + 0.02 * ((step // 40) % 3),
                "final.hidden_rms": 0.0 if pad else 1.33 + 0.001 * (step // 40),
                "final.logz": 5.545 if pad else 6.7 + 0.01 * ((step // 40) % 3)}
    frames = [{"run": "r", "rank": 0, "seq": i + 1, "step": s, "time": 1000.0 + s,
               "scalars": scalars(s), "heads": {}} for i, s in enumerate(steps)]
    alerts = alerts_of(frames)
    assert not [a for a in alerts if a.rule.startswith("final_")], \
        [(a.rule, a.fired_step) for a in alerts]
    # the same burst judged by plain medians pages both (what the rules did before)
    plain = [dataclasses.replace(r, params={k: v for k, v in r.params.items()
                                            if k != "step_weighted"})
             if r.name.startswith("final_") else r for r in DEFAULT_RULES]
    fired = {a.rule for a in alerts_of(frames, rules=plain)}
    assert {"final_rms_departure", "final_logz_departure"} <= fired, fired


def test_a_smoothed_departure_counts_its_persistence_from_the_raw_samples() -> None:
    """log Z drifting up from step 400 (+0.09 nat a step), sampled every 50 steps: the
    sample at 450 is already a nat out, the level (100-step median) crosses at 500, and
    the breach is known to have held since 450, so the warning comes at 500, not one
    sample (50 steps) later. One wild sample among calm ones still pages nothing."""
    def drift(step: int) -> dict[str, float]:
        return {"loss": 2.5, "final.logz": 6.3 + 0.01 * ((step // 50) % 3)
                + max(0, step - 400) * 0.09}

    fired = {k: [a.fired_step for a in by_rule(alerts_of(frames_at(k, 560, drift)),
                                               "final_logz_departure")] for k in (1, 40, 50)}
    assert fired[50] == [500], fired
    assert fired[40] == [480], fired  # samples 440 (10.0) and 480 (13.5): since 440
    assert fired[1] and fired[1][0] <= 465, fired

    def one_wild(step: int) -> dict[str, float]:
        return {"loss": 2.5, "final.logz": 6.3 + (5.0 if step == 450 else 0.0)}

    for k in (1, 10, 50):
        assert not by_rule(alerts_of(frames_at(k, 700, one_wild)), "final_logz_departure"), k


def test_a_calm_sample_under_a_breaching_level_enters_the_baseline() -> None:
    """Every 50 steps, two samples on bad batches (log Z 5.4 at 421, 10.9 at 451: the hooks
    sampled right after a loss spike) and calm ones after: the level judged at 501 is the
    bad sample's (it stands for 50 steps), but the calm sample at 501 goes into the
    memory, so the level at 551 is calm again and nothing fires. (Keeping every sample
    out while the level breaches let one bad batch stand for 100 steps and page at 551.)"""
    steps = [*range(0, 401, 50), 421, 451, *range(501, 800, 50)]

    def logz(step: int) -> float:
        return {421: 5.42, 451: 10.86}.get(step, 6.3 + 0.05 * ((step // 50) % 3))

    frames = [{"run": "r", "rank": 0, "seq": i + 1, "step": s, "time": 1000.0 + s,
               "scalars": {"loss": 2.5, "final.logz": logz(s)}, "heads": {}}
              for i, s in enumerate(steps)]
    assert not by_rule(alerts_of(frames), "final_logz_departure")


def test_a_level_from_few_samples_must_clear_the_limit_by_its_noise() -> None:
    """A healthy run's log Z (LM head growing 0.25 %/step for 300 steps, then steady),
    sampled every 50 steps, as recorded: 1.1 nat up over 300 steps, the two samples at 450
    and 500 just past baseline + 1 nat with a baseline of 5 noisy samples. With the gap's
    standard error (``noise_z``) it pages nothing; without it, it pages at 500."""

    logz = dict([(0, 5.55), (50, 5.25), (100, 5.98), (150, 6.19), (200, 6.44), (250, 6.78),
                 (300, 6.7), (350, 7.32), (400, 7.18), (450, 7.94), (500, 7.97),
                 (550, 7.62), (600, 7.76), (650, 7.84), (700, 7.8), (750, 7.9)])
    frames = frames_at(50, 800, lambda s: {"loss": 2.0, "final.logz": logz[s]})
    assert not by_rule(alerts_of(frames), "final_logz_departure")
    plain = defaults_with("final_logz_departure", params={"noise_z": 0.0})
    assert [a.fired_step for a in by_rule(alerts_of(frames, rules=plain),
                                          "final_logz_departure")] == [500]


def test_a_slow_log_z_drift_must_go_further_than_one_running_away() -> None:
    """log Z (every step, 0.1 nat of noise) creeping 0.011 nat a step for 250 steps, then
    steady: its level gets 1.01 nat over its baseline while its 20-step level rises 0.55 nat
    in 50 steps, and that paged at 455 with a flat nat margin (taken back below). A slow
    drift pages once 1.25 nat out (``slow_margin``); this one stops short, at any interval.
    A drift running away (0.03 nat a step) still pages where it did, at 488: its level climbs
    1.5 nat in 50 steps (``climb``: 0.7). A job that sends no per-step history is judged as
    before."""
    noise = random.Random(0)
    wander = [noise.gauss(0.0, 0.1) for _ in range(800)]

    def slow(step: int) -> dict[str, float]:
        creep = 0.011 * min(250, max(0, step - 300))
        return {"loss": 2.5, "final.logz": 6.0 + wander[step] + creep}

    def runaway(step: int) -> dict[str, float]:
        return {"loss": 2.5, "final.logz": 6.0 + wander[step] + 0.03 * max(0, step - 400)}

    flat = defaults_with("final_logz_departure", params={"climb": None, "slow_margin": None,
                                                         "fast_margin": None})

    def fired(k: int, scalars: Any, rules: Any = None) -> list[int]:
        return [a.fired_step for a in by_rule(
            alerts_of(frames_at(k, 800, scalars, history=k > 1), rules=rules),
            "final_logz_departure")]

    for k in (1, 10, 50):
        assert fired(k, slow) == [] and fired(k, slow, flat) == [455], k
        assert fired(k, runaway) == fired(k, runaway, flat) == [488], k
    # without every step's log Z (no history) the rise cannot be read: judged as before
    for k in (10, 50):
        sparse = frames_at(k, 800, slow)
        assert [a.fired_step for a in by_rule(alerts_of(sparse), "final_logz_departure")] \
            == [a.fired_step for a in by_rule(alerts_of(sparse, rules=flat),
                                              "final_logz_departure")] != [], k


def test_a_log_z_ramp_is_judged_on_its_short_level_unless_the_loss_falls() -> None:
    """log Z (every step, 0.1 nat of noise) ramping 0.1 nat a step from step 400 (an LM head
    growing while the loss creeps up): the 100-step level lags the ramp by 50 steps and
    pages at 459; judged on its 20-step level while that rose 0.75 nat in each half of the
    last 50 steps, 1.5 nat out, the newest sample on or over it, for 5 steps in a row, it
    pages at 446 (round thirty-five), at any interval. The same ramp with the loss falling
    to 0.1 (the model confident because it is right) waits for the 100-step level (459; 446
    without the loss's guard). Garbage stretches are no ramp: log Z held 2 nat up for 40
    steps straddles the jump in its short levels for one step (paged at 434 without the
    persistence), and a 35-step stretch of one repeated token (log Z 4 nat up and climbing,
    the loss down to 0.1) pages nothing, early in the run too. A job without per-step history
    is judged as before."""
    noise = random.Random(1)
    wander = [noise.gauss(0.0, 0.1) for _ in range(800)]

    def ramp(step: int) -> dict[str, float]:
        up = max(0, step - 400)
        return {"loss": 2.5 + 0.01 * up, "final.logz": 6.0 + wander[step] + 0.1 * up}

    def confident(step: int) -> dict[str, float]:
        up = max(0, step - 400)
        return {"loss": max(0.1, 2.5 - 0.02 * up), "final.logz": 6.0 + wander[step] + 0.1 * up}

    def held(step: int) -> dict[str, float]:
        up = 400 <= step < 440
        return {"loss": 3.0 if up else 2.5, "final.logz": 6.0 + wander[step] + 2.0 * up}

    def stretch(start: int) -> Any:
        def scalars(step: int) -> dict[str, float]:
            if start <= step < start + 35:
                return {"loss": 0.1, "final.logz": 10.0 + wander[step] + 0.1 * (step - start)}
            return {"loss": 2.5, "final.logz": 6.0 + wander[step]}
        return scalars

    slow = defaults_with("final_logz_departure", params={"fast_margin": None})
    unguarded = defaults_with("final_logz_departure", params={"fast_not_falling": None})
    at_once = defaults_with("final_logz_departure", params={"fast_for": 1})

    def fired(scalars: Any, k: int, rules: Any = None, history: bool = True) -> list[int]:
        frames = frames_at(k, 700, scalars, history=history and k > 1)
        return [a.fired_step for a in by_rule(alerts_of(frames, rules=rules),
                                              "final_logz_departure")]

    for k in (1, 10, 50):
        assert fired(ramp, k) == [446] and fired(ramp, k, slow) == [459], k
        assert fired(confident, k) == fired(confident, k, slow) == [459], k
        assert fired(confident, k, unguarded) == [446], k
        assert fired(held, k) == fired(held, k, slow) == [] and fired(held, k, at_once) == [434]
        for start in (320, 400):
            assert fired(stretch(start), k) == fired(stretch(start), k, slow) == [], (k, start)
    # without every step's log Z the short levels cannot be read: judged as before
    for k in (10, 50):
        assert fired(ramp, k, history=False) == fired(ramp, k, slow, history=False) != [], k
