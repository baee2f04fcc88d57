"""Warm-ups ramping too far, through the real ingest and engine (SQLite): the loss climbing
at the clip (``loss_clip_ramp``), with the gradient's level (``loss_grad_ramp``), or half a
nat alone (``loss_ramp``), while the learning rate still climbs.
"""

from __future__ import annotations

import math
import random
from typing import Any

from logitwatch.server.schemas import AlertOut
from tests.alert_frames import alerts_of, by_rule, defaults_with, frames_at


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

    def ramps(lr_at) -> list[AlertOut]:  # type: ignore[no-untyped-def]
        frames = frames_at(10, 300, _warmup_run(lr_at, climb), history=True)
        return by_rule(alerts_of(frames), "loss_ramp")

    def fired(lr_at) -> list[int]:  # type: ignore[no-untyped-def]
        return [a.fired_step for a in ramps(lr_at)]

    got = fired(lambda s: 1e-3 * (s + 1) / 1000)  # still warming up
    assert got and 220 <= got[0] <= 250, got
    # the message gives the rise in the rule's own unit, nats above the lowest level
    first = ramps(lambda s: 1e-3 * (s + 1) / 1000)[0]
    above = first.evidence["above_lowest"]
    assert 0.5 <= above < 1.0 and f"{above:.4g} above the lowest" in first.message, first.message
    assert "x the lowest" not in first.message
    assert fired(lambda s: 1e-3) == []  # flat LR
    assert fired(lambda s: 1e-4 if s < 200 else 1e-3) == []  # stepped x10 at 200


def test_an_lr_backoff_coming_back_to_its_schedule_is_no_warm_up() -> None:
    """A flat-schedule run whose loss sits 0.8 nat up for 75 steps (a bad data shard, shown
    as an `info` loss jump) while the job's LR backoff fuse (x0.5 at step 400, back to the
    schedule over 200 steps, ``fuse.lr_backoff.multiplier`` in its frames) brings the LR
    back: the LR climbs, but it is the fuse's climb, not a warm-up, and no ramp rule pages
    (a page would trigger the backoff again). The same LR and loss from a job that does not
    say it is backing off read as a warm-up ramping too far, at intervals 1 and 10."""
    import math

    def mult(step: int) -> float:
        k = step - 400
        return 1.0 if not 0 <= k < 200 else 0.5 + 0.25 * (1 - math.cos(math.pi * k / 200))

    def scalars(step: int, said: bool = True) -> dict[str, float]:
        noise = 0.03 * ((step * 7) % 5 - 2)
        out = {"loss": 3.0 + noise + (0.8 if 395 <= step < 470 else 0.0),
               "grad.norm": 0.5 + 0.02 * ((step * 3) % 5), "lr": 1e-3 * mult(step)}
        if said:
            out["fuse.lr_backoff.multiplier"] = mult(step)
        return out

    ramps = ("loss_ramp", "loss_grad_ramp", "loss_clip_ramp")
    for k in (1, 10):
        alerts = alerts_of(frames_at(k, 700, scalars, history=k > 1))
        assert not [a for a in alerts if a.rule in ramps], (k, alerts)
        assert [a.severity for a in by_rule(alerts, "loss_jump")] == ["info"], k
        blind = alerts_of(frames_at(k, 700, lambda s: scalars(s, said=False), history=k > 1))
        assert [a.paged_step for a in by_rule(blind, "loss_ramp")] == [460], k


def test_a_noisy_loss_own_wander_is_no_ramp_but_a_climb_through_it_is() -> None:
    """A loss with a large vocabulary's batch noise (0.2 nat a step) on a plateau that
    wanders 0.08 nat, clipped on every step while the LR warms up: its 20-step level drifts
    0.3 nat above the lowest it touched, which paged `loss_clip_ramp` while its margin was a
    fixed 0.3 nat (taken back below); it is within twice the loss's own step noise
    (``noise_margin``), so it does not page now. The same run climbing 0.02 nat a step from
    step 400 still pages within 30 steps."""
    def run(seed: int, ramp_at: int | None = None, rules: Any = None) -> list[int]:
        rnd = random.Random(seed)
        noise = [rnd.gauss(0.0, 0.2) for _ in range(700)]

        def scalars(step: int) -> dict[str, float]:
            loss = 4.6 + 0.08 * math.sin(2 * math.pi * step / 150) + noise[step]
            if ramp_at is not None and step > ramp_at:
                loss += 0.02 * (step - ramp_at)
            return {"loss": loss, "grad.norm": 1.3, "grad.clipped": float(step > 60),
                    "lr": 1e-3 * (step + 1) / 1000}
        alerts = alerts_of(frames_at(1, 700, scalars), rules)
        return [a.fired_step for a in by_rule(alerts, "loss_clip_ramp")]

    fixed = defaults_with("loss_clip_ramp", {"noise_margin": None})
    for seed in range(3):
        assert run(seed, rules=fixed), seed  # the old fixed margin paged the wander
        assert run(seed) == [], seed
        climbed = run(seed, ramp_at=400)
        assert climbed and 400 < climbed[0] <= 430, (seed, climbed)


def test_a_fast_ramp_late_in_a_decayed_schedule_pages_a_step_held_does_not() -> None:
    """A second warm-up begun late, from an LR decayed to a quarter of its peak, climbs x20
    over 50 steps (past ``rising_max``, 4x) with the loss's level 0.4 nat over its best at
    the clip: the ramp still going on (the LR up on each of its last 5 steps,
    ``ramp_steps``) pages ``loss_clip_ramp`` before the LR is ten times its settled peak
    (``lr_above_peak``), at intervals 1 and 25. The same loss under a step x8 taken and
    held (a bump: up on one step only) does not: that is the LR rules' to judge."""
    peak, start = 1e-3, 650

    def decayed(step: int) -> float:
        return peak * (1 if step < 200 else max(0.25, 1 - 0.75 * (step - 200) / 400))

    def ramp(step: int) -> float:  # x300 over 300 steps from `start`, linear
        return decayed(step) * (1 + 299 * min(step - start, 300) / 300 if step > start else 1)

    def bump(step: int) -> float:
        return decayed(step) * (8.0 if step > start else 1.0)

    def loss(step: int) -> float:
        return 2.0 + (min(0.4, 0.02 * (step - start)) if step > start else 0.0)

    def clipped(step: int) -> float:
        return 1.0 if step > start - 40 else 0.0

    for k in (1, 25):
        got, alerts = _fired_by("loss_clip_ramp", start + 60,
                                _warmup_run(ramp, loss, lambda s: 1.5, clipped), k)
        assert got and start + 15 <= got[0][0] <= start + 35, (k, got)
        assert by_rule(alerts, "loss_clip_ramp")[0].evidence["ramping"] is True
        peak_alerts = by_rule(alerts, "lr_above_peak")
        assert not peak_alerts or peak_alerts[0].fired_step > got[0][0]
        held, _ = _fired_by("loss_clip_ramp", start + 60,
                            _warmup_run(bump, loss, lambda s: 1.5, clipped), k)
        assert held == [], (k, held)
