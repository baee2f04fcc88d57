"""The paging policy and rules in steps, through the real ingest and engine (SQLite):

* the same rule means the same at any sampling interval (windows, lags, histories and
  persistence count steps; per-head statistics are judged at most once every 10 steps);
* a page needs persistence: a loss bump that recovers is shown as ``info`` and resolves as
  recovered, one that persists escalates to ``critical`` (``paged_step``);
* overflow is judged on what the softmax receives: a soft-capped attention whose raw logits
  run away is not forecast to overflow, and its departure is ``info``;
* a gradient norm under the job's own clip threshold is not a blow-up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.replay import replay
from logitwatch.server.alerts.rules import RuleSpec
from logitwatch.server.schemas import AlertOut

FP16 = 65504.0


def frames_at(interval: int, steps: int, scalars: Any, heads: Any = None,
              run: str = "r", history: bool = False) -> list[dict[str, Any]]:
    """Frames a job sampling every ``interval`` steps sends: step 0, interval, ...;
    ``scalars(step)`` and ``heads(step)`` give each frame's values. With ``history`` each
    frame also carries the scalars of every step since the previous frame, as the hooks
    send them (``logitwatch.wire``)."""
    out = []
    for i, step in enumerate(range(0, steps, interval)):
        f = {"run": run, "rank": 0, "seq": i + 1, "step": step, "time": 1000.0 + step,
             "scalars": scalars(step), "heads": heads(step) if heads else {}}
        between = list(range(max(0, step - interval + 1), step))
        if history and between:
            rows = [scalars(s) for s in between]
            f["history"] = {"steps": between,
                            "scalars": {k: [r.get(k) for r in rows] for k in rows[0]}}
        out.append(f)
    return out


def alerts_of(frames: list[dict[str, Any]], rules: Any = None) -> list[AlertOut]:
    return replay(frames, rules=rules).alerts


def by_rule(alerts: list[AlertOut], name: str) -> list[AlertOut]:
    return [a for a in alerts if a.rule == name]


def _defaults_with(name: str, params: dict[str, Any] | None = None,
                   page: dict[str, Any] | None = None,
                   rules: Sequence[RuleSpec] = DEFAULT_RULES) -> list[RuleSpec]:
    """``rules`` (the defaults), rule ``name``'s params updated by ``params`` and its page's
    fields by ``page``: a change taken back, to show the test fails without it."""
    return [dataclasses.replace(r, params={**r.params, **(params or {})},
                                page=dataclasses.replace(r.page, **page) if page else r.page)
            if r.name == name else r for r in rules]


def _with_damage() -> list[RuleSpec]:
    """The default rules with round ten's damage test paging again (``aftershock_above: 12``
    on ``loss_jump`` and ``grad_blowup``; dropped from the defaults in round twenty-one): the
    Page option is the user's to set."""
    damage = {"aftershock_above": 12.0}
    return _defaults_with("grad_blowup", page=damage,
                          rules=_defaults_with("loss_jump", page=damage))


def _loss(step: int) -> float:
    return 3.0 + 0.05 * math.sin(step * 1.7)  # batch noise around a plateau


def _growing(start: int, rate: float = 0.02, base: float = 5.0):  # type: ignore[no-untyped-def]
    """2 layers x 4 heads; layer 1 head 2 grows exponentially from ``start``."""
    def heads(step: int) -> dict[str, Any]:
        m = [[base + 0.1 * ((h + step // 10) % 3) for h in range(4)] for _ in range(2)]
        if step >= start:
            m[1][2] = base * math.exp(rate * (step - start))
        return {"attn.logit_max": m}
    return heads


def test_departure_means_the_same_at_every_interval() -> None:
    """A head whose max logit grows from step 600: the departure fires within one sampling
    interval of the same step whether the job samples every step, every 10 or every 40."""
    fired = {}
    for k in (1, 10, 40):
        alerts = alerts_of(frames_at(k, 900, lambda s: {"loss": _loss(s),
                                                         "attn.dtype_max": FP16},
                                     _growing(600)))
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
    alerts = alerts_of(frames_at(40, 700, lambda s: {"loss": _loss(s), "attn.dtype_max": FP16},
                                 _growing(320, rate=0.03)))
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and dep[0].fired_step < 600, [(a.rule, a.fired_step) for a in alerts]


F32 = 3.4028e38


def _departure_with(loss: Any, recover_span: Any = "default") -> list[AlertOut]:
    """Every step's loss (history at interval 10) and a float32 attention whose head (1, 2)
    grows from step 400 (5.0 -> past the floor 50 by 516): the departure alerts."""
    rules = None
    if recover_span != "default":
        rules = [dataclasses.replace(r, downgrade=dataclasses.replace(
            r.downgrade, recover_span=recover_span)) if r.name == "attn_logit_departure" else r
                 for r in DEFAULT_RULES]
    frames = frames_at(10, 760, lambda s: {"loss": loss(s), "attn.dtype_max": F32},
                       _growing(400), history=True)
    return by_rule(alerts_of(frames, rules), "attn_logit_departure")


def _garbage_then_recovery(step: int) -> float:
    """20 steps of garbage batches from 430 (loss 7), then the loss wins its ground back:
    1.5 nats up at 450, a third of that every 40 steps."""
    if 430 <= step < 450:
        return 7.0 + _loss(step)
    if step >= 450:
        return _loss(step) + 1.5 * math.exp(-(step - 450) / 40)
    return _loss(step)


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
    says with its own ``recover_share``: the default stays info, the strict one pages."""
    dep = next(r for r in DEFAULT_RULES if r.name == "attn_logit_departure")
    assert dep.downgrade is not None
    strict = dataclasses.replace(dep, name="attn_logit_departure_strict", downgrade=(
        dataclasses.replace(dep.downgrade, recover_share=1.0)))
    frames = frames_at(10, 760, lambda s: {"loss": _garbage_then_recovery(s),
                                           "attn.dtype_max": F32}, _growing(400), history=True)
    alerts = alerts_of(frames, [*DEFAULT_RULES, strict])
    (a,) = by_rule(alerts, "attn_logit_departure")
    (b,) = by_rule(alerts, "attn_logit_departure_strict")
    assert a.severity == "info" and a.paged_step is None
    assert b.severity == "warning" and b.paged_step is not None


def test_a_wide_dtype_departure_pages_when_the_loss_keeps_losing_ground() -> None:
    """The same logits with the loss climbing 0.005 nat a step from 450: it pages."""
    (a,) = _departure_with(lambda s: _loss(s) + 0.005 * max(0, s - 450))
    assert a.severity == "warning" and a.paged_step is not None
    assert a.paged_step <= 560, (a.fired_step, a.paged_step)  # 0.25 nat by 550 (+ a median)


def _warming_up(until: int, peak: float = 3.0,  # type: ignore[no-untyped-def]
                adaptive: float = 0.0):
    """A flat loss under an LR that climbs linearly to ``peak`` until step ``until``, with
    a plain optimizer (``adaptive`` 0.0, SGD) or an adaptive one (1.0, Adam)."""
    def scalars(step: int) -> dict[str, float]:
        return {"loss": _loss(step), "attn.dtype_max": F32, "optim.adaptive": adaptive,
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
    climbing = frames_at(10, 700, _warming_up(800), _growing(400), history=True)
    (a,) = by_rule(alerts_of(climbing), "attn_logit_departure")  # the defaults (0.2)
    assert a.severity == "warning" and a.paged_step == a.fired_step, a.evidence
    assert 510 <= a.fired_step <= 540, a.fired_step
    assert "downgraded" not in a.evidence and a.evidence["kept_severity"]["lr_climb"] >= 0.2
    assert "Not lowered in a wide dtype: the learning rate of a plain optimizer is still " \
        "climbing" in a.message, a.message
    (b,) = by_rule(alerts_of(climbing, _with_lr_climb(None)), "attn_logit_departure")
    assert b.severity == "info" and b.paged_step is None
    assert b.evidence["downgraded"]["loss_rise"] < 0.25
    flat = frames_at(10, 700, _warming_up(300), _growing(400), history=True)
    (c,) = by_rule(alerts_of(flat), "attn_logit_departure")
    assert c.severity == "info" and c.paged_step is None, c.evidence
    assert c.fired_step == a.fired_step
    assert "kept_severity" not in c.evidence and "Not lowered" not in c.message
    adam = frames_at(10, 700, _warming_up(800, adaptive=1.0), _growing(400), history=True)
    (d,) = by_rule(alerts_of(adam), "attn_logit_departure")
    assert d.severity == "info" and d.paged_step is None, d.evidence


def test_a_downgraded_departure_escalates_when_the_lr_starts_climbing() -> None:
    """Info while the LR is flat; a second warm-up from step 600 (20 % up by 610) lifts the
    downgrade, and the escalation says why."""
    def scalars(step: int) -> dict[str, float]:
        lr = 1.0 if step < 600 else 1.0 + 0.02 * (step - 600)
        return {"loss": _loss(step), "attn.dtype_max": F32, "lr": lr, "optim.adaptive": 0.0}
    frames = frames_at(10, 700, scalars, _growing(400), history=True)
    (a,) = by_rule(alerts_of(frames), "attn_logit_departure")
    assert a.fired_step < 600 and a.paged_step is not None and 610 <= a.paged_step <= 620
    assert "plain optimizer is still climbing" in a.evidence["escalated_because"], a.evidence


def _bump(start: int, length: int, height: float):  # type: ignore[no-untyped-def]
    def scalars(step: int) -> dict[str, float]:
        v = _loss(step) + (height if start <= step < start + length else 0.0)
        return {"loss": v, "lr": 1e-3}
    return scalars


def test_a_loss_bump_that_recovers_is_shown_not_paged() -> None:
    """Every step's loss; 40 steps of a bad-data bump (+11 nats), then full recovery: the
    loss_jump alert is info, resolves as recovered and never pages."""
    alerts = alerts_of(frames_at(1, 700, _bump(400, 40, 11.0)))
    jumps = by_rule(alerts, "loss_jump")
    assert len(jumps) == 1
    a = jumps[0]
    assert a.severity == "info" and a.paged_step is None
    assert a.state == "resolved" and a.evidence.get("recovered") is True
    assert "Recovered at step" in a.message and "if it persists 100 steps" in a.message
    assert not [x for x in alerts if x.severity in ("warning", "critical")]


def test_a_loss_jump_that_persists_pages() -> None:
    alerts = alerts_of(frames_at(1, 700, _bump(400, 1000, 11.0)))
    jumps = by_rule(alerts, "loss_jump")
    assert len(jumps) == 1
    a = jumps[0]
    assert a.severity == "critical" and a.fired_step == 400
    assert a.paged_step is not None and 500 <= a.paged_step <= 502
    assert "persisted" in a.evidence["escalated_because"]


def test_a_single_batch_outlier_at_a_wide_interval_does_not_page() -> None:
    def scalars(step: int) -> dict[str, float]:
        return {"loss": 14.0 if step == 400 else _loss(step), "lr": 1e-3}
    alerts = alerts_of(frames_at(40, 1200, scalars))
    assert not [a for a in alerts if a.severity in ("warning", "critical")], \
        [(a.rule, a.severity, a.fired_step) for a in alerts]


def test_softcapped_scores_cannot_overflow() -> None:
    """Raw logits grow to 1e6 in a float16 attention, but the model soft-caps its scores at
    50: no forecast of an overflow, and the departure of the raw logits is info."""
    grow = _growing(300, rate=0.03)

    def heads(step: int) -> dict[str, Any]:
        raw = grow(step)["attn.logit_max"]
        capped = [[50.0 * math.tanh(x / 50.0) for x in row] for row in raw]
        return {"attn.logit_max": raw, "attn.capped_logit_max": capped}

    alerts = alerts_of(frames_at(10, 800, lambda s: {"loss": _loss(s), "attn.dtype_max": FP16},
                                 heads))
    assert not by_rule(alerts, "attn_logit_forecast")
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and all(a.severity == "info" for a in dep)
    assert dep[0].evidence["downgraded"]["capped_metric"] == "attn.capped_logit_max"
    # without the cap, the same raw logits page (forecast or departure)
    plain = alerts_of(frames_at(10, 800, lambda s: {"loss": _loss(s), "attn.dtype_max": FP16},
                                grow))
    assert [a for a in plain if a.severity == "warning"]


def _grads(norm_at: Any, clip: float | None):  # type: ignore[no-untyped-def]
    def scalars(step: int) -> dict[str, float]:
        g = norm_at(step)
        out = {"loss": _loss(step), "grad.norm": g}
        if clip is not None:
            out["grad.clipped"] = float(g > clip)
            out["grad.max_norm"] = clip
        return out
    return scalars


def test_grad_norm_under_the_clip_threshold_is_not_a_blowup() -> None:
    """max_norm 1.0; the norm sits near 0.1 and blips to 0.97 (under the clip) for a few
    steps: nothing pages."""
    def norm(step: int) -> float:
        return 0.97 if step % 200 < 3 and step > 300 else 0.1 + 0.002 * (step % 7)
    alerts = alerts_of(frames_at(1, 1000, _grads(norm, 1.0)))
    assert not by_rule(alerts, "grad_blowup"), [(a.rule, a.fired_step) for a in alerts]
    assert not [a for a in alerts if a.severity in ("warning", "critical")]


def test_unclipped_blowup_pages_once_it_persists() -> None:
    """No clipping: a one-step blip is shown (info); a norm that stays 100x up pages once
    it has persisted 60 steps (the loss not moving: with a loss jump after a precursor it
    pages at once)."""
    def blip(step: int) -> float:
        return 50.0 if step == 500 else 0.5 + 0.01 * (step % 5)
    alerts = alerts_of(frames_at(1, 800, _grads(blip, None)))
    assert not [a for a in alerts if a.severity in ("warning", "critical")], \
        [(a.rule, a.severity, a.fired_step) for a in alerts]

    def blowup(step: int) -> float:
        return 50.0 * 1.05 ** (step - 500) if step >= 500 else 0.5 + 0.01 * (step % 5)
    alerts = alerts_of(frames_at(1, 800, _grads(blowup, None)))
    paged = [a for a in alerts if a.paged_step is not None]
    assert paged and min(a.paged_step for a in paged) <= 560  # type: ignore[type-var]
    blow = by_rule(alerts, "grad_blowup")[0]
    assert blow.paged_step == 560 and "persisted 60 steps" in \
        blow.evidence["escalated_because"], blow.paged_step


def test_per_head_judged_at_most_every_ten_steps() -> None:
    """Every-step per-head frames cost the engine what a 1-in-10 sampling does: the
    departure's evidence shows a baseline window of ~20 samples, not 200."""
    alerts = alerts_of(frames_at(1, 900, lambda s: {"loss": _loss(s), "attn.dtype_max": FP16},
                                 _growing(600)), rules=DEFAULT_RULES)
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and dep[0].fired_step % 10 == 0


def test_grad_norm_level_rising_pages_and_a_bump_does_not() -> None:
    """grad.norm's level (100-step median) fivefold above the lowest it settled to pages;
    a 30-step burst of huge norms (a bad batch run) does not move the level."""
    def rising(step: int) -> float:
        base = 0.5 + 0.05 * ((step * 7) % 5)
        return base * (1.006 ** (step - 400)) if step > 400 else base
    alerts = alerts_of(frames_at(1, 900, _grads(rising, 1.0)))
    level = by_rule(alerts, "grad_norm_rising")
    assert len(level) == 1 and level[0].severity == "warning"
    # 5x at 1.006^n: n = 269 steps after 400, plus the 100-step median's lag and for_steps
    assert 690 <= level[0].fired_step <= 800, level[0].fired_step
    assert level[0].evidence["ratio"] >= 5.0

    def burst(step: int) -> float:
        return 40.0 if 500 <= step < 530 else 0.5 + 0.05 * ((step * 7) % 5)
    assert not by_rule(alerts_of(frames_at(1, 900, _grads(burst, 1.0))), "grad_norm_rising")


def test_an_unclipped_spike_with_a_loss_jump_pages_at_once_after_a_precursor() -> None:
    """No clipping; the gradient norm climbs to 4x for five steps, at step 600 it spikes
    1000x and the loss jumps on the next step: each alone is shown, together (an
    instability that was building) they are a blow-up and page at that step."""
    def scalars(step: int) -> dict[str, float]:
        g = 500.0 if step == 600 else 2.0 if 595 <= step < 600 else 0.5 + 0.01 * (step % 5)
        loss = 9.0 if step >= 601 else _loss(step)
        return {"loss": loss, "grad.norm": g}
    alerts = alerts_of(frames_at(1, 700, scalars))
    pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
    assert pages[:2] == [(601, "grad_blowup"), (601, "loss_jump")], pages
    jump = by_rule(alerts, "loss_jump")[0]
    assert jump.severity == "critical" and jump.fired_step == 601
    blow = by_rule(alerts, "grad_blowup")[0]
    # the gradient 4x up is already an unclipped spike (shown from step 595, the precursor)
    assert blow.fired_step == 595 and "corroborated: loss_jump" in blow.evidence[
        "escalated_because"]


def test_grad_norm_ramp_pages_while_the_lr_still_climbs_and_not_after() -> None:
    """A warm-up ramping the LR too far: the gradient norm's 50-step level rises sixfold
    while the LR is still climbing and pages (``grad_norm_ramp``, well before the 100-step
    ``grad_norm_rising`` would); the same norms once the LR has settled do not page it."""
    def norm(step: int) -> float:
        base = 0.3 + 0.03 * ((step * 7) % 5)
        return base * (1.01 ** (step - 300)) if step > 300 else base

    def ramp(step: int) -> dict[str, float]:
        return {**_grads(norm, None)(step), "lr": 1e-3 * (step + 1)}  # warm-up to the end

    def settled(step: int) -> dict[str, float]:
        return {**_grads(norm, None)(step), "lr": 0.1}  # constant: nothing climbing

    for k in (1, 10, 40):
        alerts = alerts_of(frames_at(k, 600, ramp, history=True))
        hit = by_rule(alerts, "grad_norm_ramp")
        assert len(hit) == 1 and hit[0].severity == "warning", (k, hit)
        # 6x the lowest level at 1.01^n: n = 180 steps after 300, plus half the 50-step
        # median's width and for_steps 10
        assert 480 <= hit[0].fired_step <= 540, (k, hit[0].fired_step)
        assert hit[0].evidence["lr_ratio"] > 1.05
        assert not by_rule(alerts_of(frames_at(k, 600, settled, history=True)),
                           "grad_norm_ramp")


def test_a_loss_jump_during_early_descent_is_seen_against_its_current_level() -> None:
    """Early training (as a recorded SGD blow-up): the loss falls from 6 to 3.3 over 30
    steps, stays there, then an unclipped blow-up at step 60 lifts it by 0.9 nat. Judged
    against the median and spread of the whole window, descent included, the jump hid
    behind the descent; against the newest 20 losses and the step-to-step noise it is seen
    at once, and with the gradient spike (after a few steps of a gradient 3-4x up: a
    building instability) it pages."""
    def scalars(step: int) -> dict[str, float]:
        noise = 0.05 * math.sin(step * 1.7)
        loss = (6.0 - 2.7 * min(step, 30) / 30) + noise
        if step >= 60:
            loss += 0.9 + 0.05 * (step - 60)
        g = 6.0 if step == 60 else 1.5 if 56 <= step < 60 else 0.4 + 0.02 * (step % 3)
        return {"loss": loss, "grad.norm": g}
    alerts = alerts_of(frames_at(1, 100, scalars))
    jump = by_rule(alerts, "loss_jump")
    assert jump and jump[0].fired_step == 60, [(a.rule, a.fired_step) for a in alerts]
    blow = by_rule(alerts, "grad_blowup")
    assert blow and blow[0].fired_step == 56 and blow[0].paged_step == 60  # shown from 56
    # the rule as it was (the whole window's median and spread) does not see it
    old = [dataclasses.replace(r, params={k: v for k, v in r.params.items()
                                          if k not in ("center_window", "noise")})
           if r.name == "loss_jump" else r for r in DEFAULT_RULES]
    assert not [a for a in by_rule(alerts_of(frames_at(1, 100, scalars), rules=old),
                                   "loss_jump") if a.fired_step <= 65]


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
    plain = _defaults_with("final_logz_departure", params={"noise_z": 0.0})
    assert [a.fired_step for a in by_rule(alerts_of(frames, rules=plain),
                                          "final_logz_departure")] == [500]


def _bumpy(jumps: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def scalars(step: int) -> dict[str, float]:
        noise = 0.02 * ((step * 7) % 5 - 2)
        return {"loss": 3.0 + noise + (1.2 if step in jumps else 0.0), "grad.norm": 0.5,
                "grad.clipped": 0.0, "lr": 1e-3}
    return scalars


def test_loss_bumps_that_keep_coming_back_page_on_the_third_within_20_steps() -> None:
    """Three one-step loss bumps within 20 steps: the first is shown (info) and waits for
    the loss's level to be judged back (``page.recover_within``: 20 steps), the later ones
    join it, and the third pages it (an unstable run, not one bad batch). Two bumps are one
    alert that recovers; three spread over 60 steps are three that recover; none pages."""
    alerts = by_rule(alerts_of(frames_at(1, 400, _bumpy((300, 308, 316)))), "loss_jump")
    (a,) = alerts
    assert a.fired_step == 300 and a.paged_step == 316 and a.severity == "critical"
    assert a.evidence["escalated_because"] == (
        "it jumped again at step 316: episode 3 within 20 steps (fired at steps 300, 308, 316)")
    assert [b["step"] for b in a.evidence["breaches"]] == [308, 316]
    for jumps, n in (((300, 308), 1), ((300, 330, 360), 3)):
        alerts = by_rule(alerts_of(frames_at(1, 400, _bumpy(jumps))), "loss_jump")
        assert len(alerts) == n, jumps
        assert all(a.paged_step is None and a.evidence.get("recovered") for a in alerts), jumps
    # the same at interval 10: the losses of every step come with the frames (history)
    alerts = by_rule(alerts_of(frames_at(10, 400, _bumpy((300, 308, 316)), history=True)),
                     "loss_jump")
    assert [a.paged_step for a in alerts][-1] is not None


def _building(jumps: tuple[int, ...], build: range, clipped: float | None):  # type: ignore[no-untyped-def]
    """Loss bumps at ``jumps`` (each back the next step); the gradient 2.4x its median over
    ``build`` (within its noise's reach: not a spike); ``grad.clipped`` on every step as
    given (None: the job does not clip)."""
    def scalars(step: int) -> dict[str, float]:
        noise = 0.02 * ((step * 7) % 5 - 2)
        out = {"loss": 3.0 + noise + (1.2 if step in jumps else 0.0),
               "grad.norm": 1.2 if step in build else 0.5 + 0.075 * ((step * 3) % 5 - 2),
               "lr": 1e-3}
        if clipped is not None:
            out["grad.clipped"] = clipped
        return out
    return scalars


def test_a_loss_bump_that_comes_back_after_the_gradient_built_pages_on_the_second() -> None:
    """Unclipped: a loss bump at 300 (out of the blue, shown), then the gradient 2.4x its
    median for five steps and a second bump at 312: an instability building, paged on the
    second episode (``page.repeats_built``), at intervals 1 and 25: the alert of the first,
    still waiting for the loss's level to be judged back, pages then. Two bumps out of the
    blue, or the same build-up on clipped steps, page nothing."""
    for k in (1, 25):
        alerts = by_rule(alerts_of(frames_at(k, 400, _building((300, 312), range(307, 312),
                                                               None), history=k > 1)),
                         "loss_jump")
        assert [a.paged_step for a in alerts] == [312], (k, alerts)
        assert alerts[0].evidence["escalated_because"] == (
            "it jumped again at step 312: episode 2 within 20 steps (fired at steps 300, "
            "312), after a precursor (the gradient norm 2.4x its median in the steps "
            "before), unclipped")
    # not through the unclipped pair: the build-up is no gradient spike
    assert not by_rule(alerts_of(frames_at(1, 400, _building((300, 312), range(307, 312),
                                                             None))), "grad_blowup")
    for scalars in (_building((300, 312), range(0), None),
                    _building((300, 312), range(307, 312), 1.0)):
        alerts = by_rule(alerts_of(frames_at(1, 400, scalars)), "loss_jump")
        assert len(alerts) == 1 and all(a.paged_step is None for a in alerts), alerts


def test_page_repeats_is_validated() -> None:
    import pytest

    from logitwatch.server.alerts.spec import Page, RuleError

    for bad in ({"repeats": 1}, {"repeats": True}, {"repeats": 3, "repeats_within": 0}):
        with pytest.raises(RuleError, match="repeats"):
            Page(**bad)
    assert Page(repeats=3).to_dict()["repeats_within"] == 20
    assert Page.from_dict({"repeats": 2, "repeats_within": 50}).repeats == 2
    for bad in ({"repeats": 3, "repeats_built": 4, "precursor_above": 2.0, "with_rules": ("a",)},
                {"repeats": 3, "repeats_built": 1, "precursor_above": 2.0, "with_rules": ("a",)}):
        with pytest.raises(RuleError, match="repeats_built must be"):
            Page(**bad)
    with pytest.raises(RuleError, match="give repeats and precursor_above"):
        Page(repeats=3, repeats_built=2)
    assert Page.from_dict({"repeats": 3, "repeats_built": 2, "precursor_above": 2.2,
                           "with_rules": ["a"]}).repeats_built == 2


def _sgd_run(events: dict[int, tuple[float, float]]):  # type: ignore[no-untyped-def]
    """No clipping; at the given steps (loss, grad norm) replace the plateau's."""
    def scalars(step: int) -> dict[str, float]:
        loss, g = events.get(step, (_loss(step), 0.6 + 0.2 * ((step * 7) % 5) / 4))
        return {"loss": loss, "grad.norm": g}
    return scalars


def test_an_unclipped_one_batch_spike_that_recovers_is_shown_not_paged() -> None:
    """Unclipped SGD: one batch spikes the gradient 70x and the loss a nat, and the next
    step is back on the plateau: shown (info), not paged, at every interval."""
    for k in (1, 10, 50):
        alerts = alerts_of(frames_at(k, 700, _sgd_run({400: (4.0, 45.0)}), history=True))
        fired = {a.rule for a in alerts}
        assert {"loss_jump", "grad_blowup"} <= fired, (k, fired)
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
        page = by_rule(alerts, "grad_blowup")[0].evidence["page"]
        assert page["precursor_above"] == 2.2 and page["with_rules"] == ["loss_jump"]


def test_an_unclipped_garbage_batch_with_an_aftershock_is_shown_not_paged() -> None:
    """Unclipped SGD meets one garbage batch out of the blue: the loss jumps 5.5 nats, the
    gradient 8x, and the kick leaves both up for two more steps (an aftershock, the loss
    out of range again on the third): shown, not paged. The same jump after five steps of
    a gradient 4x up (a building instability) pages at once."""
    shock = {400: (8.5, 4.0), 401: (3.2, 3.5), 402: (3.9, 1.2)}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(shock), history=k > 1))
        assert {"loss_jump", "grad_blowup"} <= {a.rule for a in alerts}
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
    building = {**{s: (_loss(s), 2.6) for s in range(395, 400)}, **shock}
    alerts = alerts_of(frames_at(1, 700, _sgd_run(building)))
    pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
    assert pages and pages[0][0] == 400, pages
    assert by_rule(alerts, "loss_jump")[0].evidence["precursor"] >= 2.2


def test_a_garbage_batch_that_damaged_the_weights_pages_once_the_damage_persists() -> None:
    """Unclipped SGD meets one garbage batch out of the blue, and its update wrecks the
    weights: on the next (clean) batch the loss is still 4 nats up and the gradient 20x its
    median, and the run never comes back. Nothing built up before, so the precursor is
    quiet. The damage is one batch's reading (``evidence.aftershock``, kept in the
    evidence): shown at once, paged once the gradient has stayed up 60 steps, at every
    interval (round twenty-one: a healed garbage batch's next batch reads alike). With
    ``aftershock_above: 12`` (round ten's damage test, a Page option) it pages on that next
    step; there, the garbage batch whose next batch's gradient is 10x up stays shown."""
    events = {400: (9.0, 12.0), 401: (7.0, 14.0), 402: (5.5, 6.0),
              **{s: (5.0, 2.5) for s in range(403, 700)}}
    for k in (1, 25):
        frames = frames_at(k, 700, _sgd_run(events), history=k > 1)
        alerts = alerts_of(frames)
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400, jump.fired_step
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0] == (460, "grad_blowup"), (k, pages)
        alerts = alerts_of(frames, rules=_with_damage())
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0][0] == 401, (k, pages)
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400 and jump.severity == "critical"
        assert "after damage (the gradient norm 20x its median" in \
            jump.evidence["escalated_because"], jump.evidence
    # the same kick, its next batch's gradient 10x its median (the healthy runs' largest
    # read 9.6x in round ten), and the run recovers: shown, not paged
    mild = {400: (9.0, 12.0), 401: (7.0, 7.0), 402: (3.9, 1.2)}
    alerts = alerts_of(frames_at(1, 700, _sgd_run(mild)), rules=_with_damage())
    assert {"loss_jump", "grad_blowup"} <= {a.rule for a in alerts}
    assert not [a for a in alerts if a.severity in ("warning", "critical")], \
        [(a.rule, a.severity, a.fired_step) for a in alerts]


def test_a_garbage_batch_whose_next_batch_the_weights_still_fit_is_shown_not_paged() -> None:
    """Unclipped SGD meets one garbage batch, and the next (clean) batch's gradient is 15x
    its median, over the damage threshold (12x), but its loss is only 1.5 nats over the
    median: the weights still read clean data nearly as well as before, and the run heals.
    Shown, not paged, under round ten's damage test (``aftershock_above: 12``). The same
    kick whose next batch is still 3 nats up (the weights no longer fit the data) pages on
    that next step under it; without the loss condition (``aftershock_loss`` 0) the healing
    run would page too. The default rules page neither on that step."""
    median = 0.7  # the plateau's gradient norms read 0.6-0.8

    def events(next_loss: float) -> dict[int, tuple[float, float]]:
        return {400: (9.0, 12.0), 401: (next_loss, 15 * median), 402: (3.3, 1.2)}

    damage = _with_damage()
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(events(4.5)), history=k > 1),
                           rules=damage)
        assert {"loss_jump", "grad_blowup"} <= {a.rule for a in alerts}
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
        wrecked = frames_at(k, 700, _sgd_run(events(6.0)), history=k > 1)
        alerts = alerts_of(wrecked, rules=damage)
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0][0] == 401, (k, pages)
        jump = by_rule(alerts, "loss_jump")[0]
        assert "the loss still 3.01 over its median" in jump.evidence["escalated_because"], \
            jump.evidence["escalated_because"]
        assert not [a for a in alerts_of(wrecked) if a.severity in ("warning", "critical")]
    no_gate = _defaults_with("loss_jump", params={"aftershock_loss": 0.0}, rules=damage)
    alerts = alerts_of(frames_at(1, 700, _sgd_run(events(4.5))), rules=no_gate)
    assert min(a.paged_step for a in alerts if a.paged_step is not None) == 401


def test_under_an_adaptive_optimizer_a_garbage_batch_is_judged_without_the_damage_gate(
) -> None:
    """The damaging garbage batch of the test above, in a job whose optimizer normalises
    each step by the gradient's running RMS (``optim.adaptive`` 1, sent with the sampled
    frames only): the kick's update was bounded, so the next batch's gradient is no sign of
    damage. Nothing pages on the next step; the gradient that stays up pages once it has
    persisted 60 steps, the loss that never comes back after 100, at intervals 1 and 25,
    also under round ten's damage test (``aftershock_above: 12``), which under the job's
    SGD (0) pages on the next step."""
    events = {400: (9.0, 12.0), 401: (7.0, 14.0), 402: (5.5, 6.0),
              **{s: (5.0, 2.5) for s in range(403, 700)}}

    def frames(k: int, kind: float) -> list[dict[str, Any]]:
        base = _sgd_run(events)
        out = frames_at(k, 700, lambda s: {**base(s), "optim.adaptive": kind}, history=k > 1)
        for f in out:  # as the hooks send it: not a column of each step's history
            (f.get("history") or {}).get("scalars", {}).pop("optim.adaptive", None)
        return out

    for k in (1, 25):
        alerts = alerts_of(frames(k, 1.0), rules=_with_damage())
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400 and jump.paged_step == 500, (k, jump.paged_step)
        assert "persisted 100 steps" in jump.evidence["escalated_because"]
        blow = by_rule(alerts, "grad_blowup")[0]
        assert blow.paged_step == 460 and "persisted 60 steps" in \
            blow.evidence["escalated_because"], (k, blow.paged_step)
        assert min(a.paged_step for a in alerts if a.paged_step is not None) == 460
    alerts = alerts_of(frames(25, 0.0), rules=_with_damage())
    assert min(a.paged_step for a in alerts if a.paged_step is not None) == 401


def test_a_stretch_of_garbage_data_under_unclipped_sgd_is_shown_not_paged() -> None:
    """Unclipped SGD meets 15 steps of garbage data: the loss jumps 5.5 nats, then wanders
    2.9-3.5 nats up, under its first kick, with the gradient 3.4x its median the whole
    time, and comes back. The gradient is up because the data is garbage, not because an
    instability builds: a breach that does not take the loss to a new high for its run of
    jumps carries no precursor, and nothing pages, at intervals 1 and 25."""
    stretch = {400: (8.5, 4.0), **{s: (6.2 + 0.3 * ((s * 7) % 3 - 1), 2.4)
                                    for s in range(401, 415)}}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(stretch), history=k > 1))
        assert {"loss_jump", "grad_blowup"} <= {a.rule for a in alerts}
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])


def test_a_gradient_left_up_by_a_garbage_stretch_that_heals_is_shown_not_paged() -> None:
    """Unclipped SGD meets 15 steps of garbage data, and after it the loss is back on its
    plateau while the gradient stays 3.5x its median for 45 more steps as the weights heal:
    shown, not paged, at intervals 1 and 25 (``grad_blowup`` alone pages after 60 steps;
    after 30, as before round sixteen, this run paged)."""
    events = {400: (8.5, 5.0), **{s: (5.5 + 0.05 * (s % 3), 2.4) for s in range(401, 415)},
              **{s: (_loss(s) + 0.1, 2.5) for s in range(415, 460)}}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(events), history=k > 1))
        assert "grad_blowup" in {a.rule for a in alerts}
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
    at30 = _defaults_with("grad_blowup", page={"after": 30})
    alerts = alerts_of(frames_at(1, 700, _sgd_run(events)), rules=at30)
    assert [a.paged_step for a in by_rule(alerts, "grad_blowup") if a.paged_step], alerts


def test_a_small_jump_in_the_wake_of_a_garbage_batch_is_shown_not_paged() -> None:
    """Unclipped SGD meets one garbage batch (the loss 5.5 nats up); for the next 15 steps
    the loss sits a third of a nat up with the gradient 2-3x its median while the weights
    heal, and eight steps after the kick the loss jumps again, by a nat: far under the
    kick. The gradient in the steps before that jump is up because of the kick, not
    because an instability builds: a breach within ``precursor_wake`` steps of a higher
    jump carries no precursor, and nothing pages, at intervals 1 and 25. The same second
    jump climbing past the kick (a blow-up) pages on its step."""
    wake = {400: (8.5, 4.0), **{s: (3.35, 1.6 + 0.4 * (s % 3)) for s in range(401, 416)},
            408: (4.1, 1.9)}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(wake), history=k > 1))
        # the second jump joins the first's alert, still waiting for the loss's level
        (jump,) = by_rule(alerts, "loss_jump")
        assert jump.fired_step == 400 and jump.evidence["latest"]["step"] == 408, k
        assert jump.evidence["latest"]["evidence"]["precursor"] == 0.0
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
    climbs = {**wake, 408: (9.5, 12.0), **{s: (12.0, 30.0) for s in range(409, 430)}}
    alerts = alerts_of(frames_at(1, 700, _sgd_run(climbs)))
    pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
    assert pages and pages[0][0] == 408, pages


def test_a_blow_up_after_the_loss_stayed_up_pages_on_its_own_step() -> None:
    """Unclipped SGD: the loss leaves its range at step 400 and stays a nat up for four
    steps, the gradient climbing to 3x, then at step 404 both explode. The precursor is
    judged per breach: the episode's first breach came out of the blue, but what preceded
    the explosion (beyond the first three steps of the run of jumps) was building, and it
    pages at step 404, at every interval, not after."""
    events = {400: (4.2, 0.9), 401: (4.3, 1.6), 402: (4.4, 1.9), 403: (4.5, 2.2),
              404: (19.0, 16.0), **{s: (25.0, 40.0) for s in range(405, 420)}}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(events), history=k > 1))
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0][0] == 404, (k, pages)
        assert by_rule(alerts, "loss_jump")[0].fired_step == 400


def test_a_blow_up_that_climbs_within_its_first_steps_pages_where_it_climbs() -> None:
    """Unclipped SGD, out of the blue: the loss leaves its range by a nat with the gradient
    6x up, stays up on the next step, and on the third climbs 11 nats past both with the
    gradient 40x. No precursor can speak yet (a run's first step and the two after it are
    left out of it, so one garbage batch's kick and aftershock are not their own), but a
    loss still up on its next steps that climbs 2.5 nats past its earlier jumps is a
    blow-up: it pages on the climbing step at every interval (round twenty-two), where
    without ``climb_above`` it paged two steps later. One garbage batch (back the next
    step) and a garbage stretch (wandering under its kick) never climb: see the tests
    above."""
    events = {400: (4.2, 4.0), 401: (4.5, 2.5), 402: (15.5, 30.0),
              **{s: (40.0 + s - 403, 80.0) for s in range(403, 430)}}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(events), history=k > 1))
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0][0] == 402, (k, pages)
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400 and "climbing (the loss 11 nats over" in jump.evidence[
            "escalated_because"], jump.evidence
    without = _defaults_with("grad_blowup", page={"climb_above": None},
                             rules=_defaults_with("loss_jump", page={"climb_above": None}))
    alerts = alerts_of(frames_at(1, 700, _sgd_run(events)), rules=without)
    pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
    assert pages and pages[0][0] > 402, pages


def test_two_unclipped_blips_far_apart_are_two_episodes_not_a_persisting_one() -> None:
    """Gradient blips 48 steps apart, the loss untouched: each is its own short episode
    (grad_blowup holds 10 steps), not one that "persisted" 48 steps; nothing pages."""
    alerts = alerts_of(frames_at(1, 700, _sgd_run({401: (_loss(401), 9.0),
                                                   449: (_loss(449), 9.0)})))
    blow = by_rule(alerts, "grad_blowup")
    assert len(blow) == 2 and all(a.severity == "info" for a in blow), \
        [(a.fired_step, a.severity) for a in blow]


def test_page_confirmation_is_validated() -> None:
    import pytest

    from logitwatch.server.alerts.spec import Page, RuleError

    with pytest.raises(RuleError, match="confirm_steps"):
        Page(with_rules=("a",), confirm_steps=-1)
    with pytest.raises(RuleError, match="at_once_above"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=float("nan"))
    with pytest.raises(RuleError, match="give with_rules"):
        Page(after=10, confirm_steps=1)
    with pytest.raises(RuleError, match="precursor_above"):
        Page(with_rules=("a",), precursor_above=-1)
    with pytest.raises(RuleError, match="aftershock_above"):
        Page(with_rules=("a",), precursor_above=2.2, aftershock_above=float("inf"))
    with pytest.raises(RuleError, match="give precursor_above"):
        Page(with_rules=("a",), aftershock_above=12)
    with pytest.raises(RuleError, match="at_once_adaptive_above must be a number"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5, confirm_adaptive=True,
             at_once_adaptive_above=-1)
    with pytest.raises(RuleError, match="under confirm_adaptive: give both"):
        Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5, at_once_adaptive_above=12)
    with pytest.raises(RuleError, match="climb_above must be a number"):
        Page(with_rules=("a",), precursor_above=2.2, climb_above="2.5")
    with pytest.raises(RuleError, match="climb_above is an alternative to precursor_above"):
        Page(with_rules=("a",), climb_above=2.5)
    back = Page.from_dict(Page(with_rules=("a",), confirm_steps=1, at_once_above=2.5,
                               precursor_above=2.2, aftershock_above=12,
                               climb_above=2.5).to_dict())
    assert (back.confirm_steps, back.at_once_above, back.precursor_above,
            back.aftershock_above, back.climb_above) == (1, 2.5, 2.2, 12, 2.5)


def _warmup_run(lr_at, loss_at, grad_at=lambda s: 0.5,  # type: ignore[no-untyped-def]
                clipped_at=lambda s: 0.0):
    def scalars(step: int) -> dict[str, float]:
        noise = 0.03 * ((step * 7) % 5 - 2)
        return {"loss": loss_at(step) + noise, "grad.norm": grad_at(step),
                "grad.clipped": clipped_at(step), "lr": lr_at(step)}
    return scalars


def _fired_by(rule: str, steps: int, scalars: Any, k: int = 1
              ) -> tuple[list[tuple[int, str]], list[AlertOut]]:
    """``rule``'s alerts as ``(fired_step, severity)`` on ``steps`` steps of ``scalars``
    sampled every ``k`` (every step's scalars in the history), and all the alerts."""
    alerts = alerts_of(frames_at(k, steps, scalars, history=k > 1))
    return [(a.fired_step, a.severity) for a in by_rule(alerts, rule)], alerts


def test_loss_clip_ramp_pages_an_early_warm_up_whose_loss_climbs_at_the_clip() -> None:
    """A warm-up ramping too far in its first 150 steps: the loss's level 0.35 nat above its
    best while the gradient is clipped on every step (its norm 1.2-1.5 at the clip: no level
    settled from step 100 to read 2.5x) pages `loss_clip_ramp`, not `loss_grad_ramp`, at
    intervals 1 and 25 (every step's clip flag travels with the frames); the same climb
    unclipped (an SGD warm-up bump), or clipped with the loss flat, does not page it."""
    def lr(step: int) -> float:
        return 1e-3 * (step + 1) / 300

    def loss(step: int) -> float:
        return 3.0 + min(0.35, 0.01 * (step - 100)) if step > 100 else 3.0

    def clipped(step: int) -> float:
        return 1.0 if step > 90 else 0.0

    def grad(step: int) -> float:
        return 1.2 + 0.3 * (step % 2) if step > 90 else 0.6

    def fired(loss_at, clipped_at, k: int = 1):  # type: ignore[no-untyped-def]
        return _fired_by("loss_clip_ramp", 180, _warmup_run(lr, loss_at, grad, clipped_at), k)

    for k in (1, 25):
        got, alerts = fired(loss, clipped, k)
        assert got and 135 <= got[0][0] <= 160 and got[0][1] == "warning", (k, got)
        ev = by_rule(alerts, "loss_clip_ramp")[0].evidence
        assert ev["grad.clipped_rate"] >= 0.75 and ev["above_lowest"] >= 0.3
        assert not by_rule(alerts, "loss_grad_ramp") and not by_rule(alerts, "loss_ramp")
    assert fired(loss, lambda s: 0.0)[0] == []  # the climb unclipped
    assert fired(lambda s: 3.0, clipped)[0] == []  # clipped, the loss flat
    # a third of the steps clipped is not "at the clip"
    assert fired(loss, lambda s: 1.0 if s > 90 and s % 3 == 0 else 0.0)[0] == []


def test_loss_grad_ramp_pages_a_warm_up_whose_loss_and_gradient_climb_together() -> None:
    """While the LR warms up: the loss's level 0.35 nat above its best with the gradient
    norm's 50-step level 3x its lowest pages `loss_grad_ramp`, before `loss_ramp`'s half
    nat; either climb alone does not (a loss bump in unclipped SGD with a flat gradient; a
    gradient rising with the LR while the loss holds: healthy QK-norm runs at a high LR)."""
    def lr(step: int) -> float:
        return 1e-3 * (step + 1) / 1000

    def loss(step: int) -> float:
        return 3.0 + min(0.35, 0.01 * (step - 200)) if step > 200 else 3.0

    def grad(step: int) -> float:
        return 0.5 * min(3.0, 1.0 + 0.04 * (step - 180)) if step > 180 else 0.5

    def fired(loss_at, grad_at, k: int = 1):  # type: ignore[no-untyped-def]
        return _fired_by("loss_grad_ramp", 400, _warmup_run(lr, loss_at, grad_at), k)

    for k in (1, 25):
        got, alerts = fired(loss, grad, k)
        assert got and 240 <= got[0][0] <= 275 and got[0][1] == "warning", (k, got)
        ev = by_rule(alerts, "loss_grad_ramp")[0].evidence
        assert ev["grad.norm_ratio"] >= 2.5 and ev["above_lowest"] >= 0.3
        assert not by_rule(alerts, "loss_ramp")  # 0.35 nat: under loss_ramp's half nat
    assert fired(loss, lambda s: 0.5)[0] == []  # the loss alone
    assert fired(lambda s: 3.0, grad)[0] == []  # the gradient alone


def test_loss_ramp_pages_a_warm_up_whose_loss_climbs_not_a_step_or_a_flat_lr() -> None:
    """The loss's 20-step level climbing 0.6 nat while the LR still warms up (linearly over
    1,000 steps) pages `loss_ramp`; the same climb while the LR stays flat after its
    warm-up, or right after the LR is stepped x10 (a step, which lr_jump judges), does not."""
    def climb(step: int) -> float:
        return 3.0 + (0.02 * (step - 200) if step > 200 else 0.0)  # +0.6 nat by step 230

    def fired(lr_at) -> list[int]:  # type: ignore[no-untyped-def]
        frames = frames_at(10, 300, _warmup_run(lr_at, climb), history=True)
        return [a.fired_step for a in by_rule(alerts_of(frames), "loss_ramp")]

    got = fired(lambda s: 1e-3 * (s + 1) / 1000)  # still warming up
    assert got and 220 <= got[0] <= 250, got
    assert fired(lambda s: 1e-3) == []  # flat LR
    assert fired(lambda s: 1e-4 if s < 200 else 1e-3) == []  # stepped x10 at 200


def test_under_an_adaptive_optimizer_a_spike_whose_loss_is_back_next_step_is_shown() -> None:
    """Unclipped RMSprop (``optim.adaptive`` 1, sent with the sampled frames only): a blip
    (the gradient 5x at 372), then one batch spikes it 135x with the loss 1.5 nats up, and
    on the next step the gradient is still 34x while the loss is back. Adam's and RMSprop's
    step is normalised, so the spike's update was bounded: shown, not paged, at intervals 1
    and 25 (the pair spans two steps only through the gradient's blip and spike, not the
    loss). Under SGD (0) the same steps page at the spike, after the precursor, as they do
    without ``confirm_adaptive``; under RMSprop a loss that climbs on to 2 nats up on the
    next step pages there, and a 3-nat jump at once only after the update that did it."""
    def events(after: float, jump: float = 1.5) -> dict[int, tuple[float, float]]:
        return {372: (_loss(372), 3.0), 375: (_loss(375) + jump, 90.0),
                376: (_loss(376) + after, 23.0)}

    def frames(k: int, kind: float, ev: dict[int, tuple[float, float]]) -> list[Any]:
        base = _sgd_run(ev)
        out = frames_at(k, 700, lambda s: {**base(s), "optim.adaptive": kind},
                        history=k > 1)
        for f in out:  # as the hooks send it: not a column of each step's history
            (f.get("history") or {}).get("scalars", {}).pop("optim.adaptive", None)
        return out

    def first_page(alerts: list[AlertOut]) -> int | None:
        return min((a.paged_step for a in alerts if a.paged_step is not None), default=None)

    for k in (1, 25):
        alerts = alerts_of(frames(k, 1.0, events(0.1)))
        assert {"loss_jump", "grad_blowup"} <= {a.rule for a in alerts}, k
        assert first_page(alerts) is None, (k, [(a.rule, a.paged_step) for a in alerts])
        assert by_rule(alerts, "grad_blowup")[0].evidence["page"]["with_rules"] == [
            "loss_jump"]
        assert first_page(alerts_of(frames(k, 0.0, events(0.1)))) == 375, k
        assert first_page(alerts_of(frames(k, 1.0, events(2.0)))) == 376, k
        # round twenty: a 3-nat jump after an ordinary update is shown; after an update of
        # 30x the gradient's median (the step before) it pages at once
        assert first_page(alerts_of(frames(k, 1.0, events(0.1, jump=3.0)))) is None, k
        went = {**events(0.1, jump=3.0), 374: (_loss(374), 21.0)}
        assert first_page(alerts_of(frames(k, 1.0, went))) == 375, k
    no_gate = [dataclasses.replace(r, page=dataclasses.replace(
        r.page, confirm_adaptive=False, at_once_adaptive_above=None))
        if r.name in ("loss_jump", "grad_blowup") else r for r in DEFAULT_RULES]
    assert first_page(alerts_of(frames(1, 1.0, events(0.1)), rules=no_gate)) == 375


def test_under_an_adaptive_optimizer_one_garbage_batch_does_not_page_at_once() -> None:
    """Round twenty: unclipped Adam meets one garbage batch: the loss jumps 9.7 nats and the
    gradient 29x on the same step, after an ordinary update (and a 3x blip five steps
    before, a precursor), and the next step is back. Shown, not paged; without
    ``at_once_adaptive_above`` it paged at once. An update of 1e4x the gradient's median
    (AdamW with eps 1, SGD-like) followed by a 15-nat jump that stays pages at its step."""
    def frames(ev: dict[int, tuple[float, float]], k: int = 1) -> list[Any]:
        base = _sgd_run(ev)
        out = frames_at(k, 700, lambda s: {**base(s), "optim.adaptive": 1.0}, history=k > 1)
        for f in out:
            (f.get("history") or {}).get("scalars", {}).pop("optim.adaptive", None)
        return out

    def first_page(alerts: list[AlertOut]) -> int | None:
        return min((a.paged_step for a in alerts if a.paged_step is not None), default=None)

    garbage = {415: (_loss(415), 2.1), 420: (_loss(420) + 9.7, 20.0)}
    no_went = [dataclasses.replace(r, page=dataclasses.replace(
        r.page, at_once_adaptive_above=None)) if r.name == "loss_jump" else r
        for r in DEFAULT_RULES]
    blow = {599: (_loss(599), 7000.0), **{s: (_loss(s) + 15.0, 12.0) for s in range(600, 700)}}
    for k in (1, 25):
        alerts = alerts_of(frames(garbage, k))
        (jump,) = by_rule(alerts, "loss_jump")
        assert first_page(alerts) is None, (k, [(a.rule, a.paged_step) for a in alerts])
        assert jump.evidence["went_in"] < 2 and jump.evidence["precursor"] >= 2.2
        assert "after an update of 12x the gradient's median" in jump.message
        assert first_page(alerts_of(frames(garbage, k), rules=no_went)) == 420, k
        assert first_page(alerts_of(frames(blow, k))) == 600, k
