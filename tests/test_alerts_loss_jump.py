"""The loss-jump paging policy, through the real ingest and engine (SQLite): loss bumps that
keep coming back, bumps after the gradient built up, unclipped one-batch spikes and garbage
batches or stretches (shown, not paged, unless their damage persists), blow-ups that climb
or stay up, and the adaptive-optimizer gates (a bounded update's loss is back next step). The
validation of the ``Page`` options these use is in ``test_alerts_page_options.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.schemas import AlertOut
from tests.alert_frames import (
    alerts_of,
    by_rule,
    defaults_with,
    frames_at,
    plateau_loss,
    with_damage,
)


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


def _kicked(jumps: dict[int, float]):  # type: ignore[no-untyped-def]
    """One-step loss jumps of the given heights (nats), each back the next step."""
    def scalars(step: int) -> dict[str, float]:
        noise = 0.02 * ((step * 7) % 5 - 2)
        return {"loss": 3.0 + noise + jumps.get(step, 0.0), "grad.norm": 0.5,
                "grad.clipped": 0.0, "lr": 1e-3}
    return scalars


def test_smaller_jumps_after_one_big_kick_are_its_aftershocks_not_repeats() -> None:
    """One batch kicks the loss 5 nats up at 300 and it is back the next step; then it jumps
    1.2 nats at 308 and again at 316 while the weights heal. With ``page.repeats_aftershock``
    0.5 (the default since round thirty) those two are the kick's aftershocks (each under half
    its jump) and do not count toward ``page.repeats``: shown, not paged. Without it, the
    third episode pages at 316.
    Jumps that keep their height or grow after a first one (1.2, 1.2, 2.0 nats; 1.2, 1.5,
    2.0) still page on the third, at intervals 1 and 25."""
    after = defaults_with("loss_jump", page={"repeats_aftershock": 0.5})
    assert after == list(DEFAULT_RULES)
    without = defaults_with("loss_jump", page={"repeats_aftershock": None})
    kick = _kicked({300: 5.0, 308: 1.2, 316: 1.2})
    (a,) = by_rule(alerts_of(frames_at(1, 400, kick), after), "loss_jump")
    assert a.paged_step is None and a.severity == "info", a.evidence
    assert "not counting a jump under 50 % of an earlier one" in a.message
    (a,) = by_rule(alerts_of(frames_at(1, 400, kick), without), "loss_jump")
    assert a.paged_step == 316 and a.evidence["escalated_because"].endswith(
        "episode 3 within 20 steps (fired at steps 300, 308, 316)")
    for k in (1, 25):
        for jumps in ({300: 1.2, 308: 1.2, 316: 2.0}, {300: 1.2, 308: 1.5, 316: 2.0}):
            alerts = by_rule(alerts_of(frames_at(k, 400, _kicked(jumps), history=k > 1),
                                       after), "loss_jump")
            assert [x.paged_step for x in alerts][-1] == 316, (k, jumps, alerts)


def test_aftershocks_are_judged_in_firing_order_and_by_size() -> None:
    """``_counted`` directly: a job restarted from a checkpoint fires twice at step 300 (a
    5-nat kick, then 1.2), and the 1.2-nat episodes after the kick stay its aftershocks; a
    rule that breaches downwards reads its drops by size (-1, then -5 twice: the bigger drops
    count, a -0.5 after them does not)."""
    from logitwatch.server.alerts.page_policy import _counted
    from logitwatch.server.alerts.rules import Track
    from logitwatch.server.alerts.spec import Page

    pg = Page(repeats=3, repeats_aftershock=0.5)
    t = Track(fired=((300, 5.0), (300, 1.2), (305, 1.2), (310, 1.2)))
    assert _counted(t, 310, pg) == [300]
    t = Track(fired=((300, -1.0), (305, -5.0), (310, -5.0), (312, -0.5)))
    assert _counted(t, 312, pg) == [300, 305, 310]
    t = Track(fired=((300, None), (305, 1.2), (310, 1.2)))  # no baseline: counts
    assert _counted(t, 310, pg) == [300, 305, 310]
    assert _counted(t, 310, Page(repeats=3)) == [300, 305, 310]


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


def _sgd_run(events: dict[int, tuple[float, float]]):  # type: ignore[no-untyped-def]
    """No clipping; at the given steps (loss, grad norm) replace the plateau's."""
    def scalars(step: int) -> dict[str, float]:
        loss, g = events.get(step, (plateau_loss(step), 0.6 + 0.2 * ((step * 7) % 5) / 4))
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
    building = {**{s: (plateau_loss(s), 2.6) for s in range(395, 400)}, **shock}
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
        alerts = alerts_of(frames, rules=with_damage())
        pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
        assert pages and pages[0][0] == 401, (k, pages)
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400 and jump.severity == "critical"
        assert "after damage (the gradient norm 20x its median" in \
            jump.evidence["escalated_because"], jump.evidence
    # the same kick, its next batch's gradient 10x its median (the healthy runs' largest
    # read 9.6x in round ten), and the run recovers: shown, not paged
    mild = {400: (9.0, 12.0), 401: (7.0, 7.0), 402: (3.9, 1.2)}
    alerts = alerts_of(frames_at(1, 700, _sgd_run(mild)), rules=with_damage())
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

    damage = with_damage()
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
    no_gate = defaults_with("loss_jump", params={"aftershock_loss": 0.0}, rules=damage)
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
        alerts = alerts_of(frames(k, 1.0), rules=with_damage())
        jump = by_rule(alerts, "loss_jump")[0]
        assert jump.fired_step == 400 and jump.paged_step == 500, (k, jump.paged_step)
        assert "persisted 100 steps" in jump.evidence["escalated_because"]
        blow = by_rule(alerts, "grad_blowup")[0]
        assert blow.paged_step == 460 and "persisted 60 steps" in \
            blow.evidence["escalated_because"], (k, blow.paged_step)
        assert min(a.paged_step for a in alerts if a.paged_step is not None) == 460
    alerts = alerts_of(frames(25, 0.0), rules=with_damage())
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
              **{s: (plateau_loss(s) + 0.1, 2.5) for s in range(415, 460)}}
    for k in (1, 25):
        alerts = alerts_of(frames_at(k, 700, _sgd_run(events), history=k > 1))
        assert "grad_blowup" in {a.rule for a in alerts}
        assert not [a for a in alerts if a.severity in ("warning", "critical")], \
            (k, [(a.rule, a.severity, a.fired_step) for a in alerts])
    at30 = defaults_with("grad_blowup", page={"after": 30})
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
    without = defaults_with("grad_blowup", page={"climb_above": None},
                             rules=defaults_with("loss_jump", page={"climb_above": None}))
    alerts = alerts_of(frames_at(1, 700, _sgd_run(events)), rules=without)
    pages = sorted((a.paged_step, a.rule) for a in alerts if a.paged_step is not None)
    assert pages and pages[0][0] > 402, pages


def test_two_unclipped_blips_far_apart_are_two_episodes_not_a_persisting_one() -> None:
    """Gradient blips 48 steps apart, the loss untouched: each is its own short episode
    (grad_blowup holds 10 steps), not one that "persisted" 48 steps; nothing pages."""
    alerts = alerts_of(frames_at(1, 700, _sgd_run({401: (plateau_loss(401), 9.0),
                                                   449: (plateau_loss(449), 9.0)})))
    blow = by_rule(alerts, "grad_blowup")
    assert len(blow) == 2 and all(a.severity == "info" for a in blow), \
        [(a.fired_step, a.severity) for a in blow]


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
        return {372: (plateau_loss(372), 3.0), 375: (plateau_loss(375) + jump, 90.0),
                376: (plateau_loss(376) + after, 23.0)}

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
        went = {**events(0.1, jump=3.0), 374: (plateau_loss(374), 21.0)}
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

    garbage = {415: (plateau_loss(415), 2.1), 420: (plateau_loss(420) + 9.7, 20.0)}
    no_went = [dataclasses.replace(r, page=dataclasses.replace(
        r.page, at_once_adaptive_above=None)) if r.name == "loss_jump" else r
        for r in DEFAULT_RULES]
    blow = {599: (plateau_loss(599), 7000.0),
            **{s: (plateau_loss(s) + 15.0, 12.0) for s in range(600, 700)}}
    for k in (1, 25):
        alerts = alerts_of(frames(garbage, k))
        (jump,) = by_rule(alerts, "loss_jump")
        assert first_page(alerts) is None, (k, [(a.rule, a.paged_step) for a in alerts])
        assert jump.evidence["went_in"] < 2 and jump.evidence["precursor"] >= 2.2
        assert "after an update of 12x the gradient's median" in jump.message
        assert first_page(alerts_of(frames(garbage, k), rules=no_went)) == 420, k
        assert first_page(alerts_of(frames(blow, k))) == 600, k
