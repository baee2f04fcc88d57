"""A departure judged downwards (``below``): a series falling out of its own range.

The engine gives a ``below`` rule the series mirrored (-x) and keeps it mirrored in the
rule's memory, then turns each verdict back into the series' own values; so a ``below``
rule on x fires exactly where the same rule without it fires on -x, and says so in x's
terms ("below its baseline").
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from logitwatch.server.alerts.rules import RuleError, RuleSpec
from tests.alert_frames import alerts_of, by_rule, frames_at

#: log Z's fall rule as a test's own (the defaults may tune theirs)
FALL = RuleSpec("logz_fall", "departure", "final.logz", for_steps=20,
                params={"margin": 1.5, "floor": None, "window": 200, "lag": 50,
                        "min_history": 300, "smooth": 100, "step_weighted": True,
                        "noise_z": 1.0, "fast_margin": 1.5, "fast_climb": 0.75,
                        "fast_not_falling": "loss", "below": True},
                summary="log Z fell 1.5 nat below its recent range")
RISE = dataclasses.replace(FALL, name="logz_rise",
                           params={**FALL.params, "below": False},
                           summary="log Z rose 1.5 nat above its recent range")

_NOISE = random.Random(3)
_WANDER = [_NOISE.gauss(0.0, 0.08) for _ in range(900)]


def _falling(step: int) -> float:
    """log Z at 6 nat with noise, falling 0.05 nat a step from step 450 (a head running
    away whose logits all sink)."""
    return 6.0 + _WANDER[step] - 0.05 * max(0, step - 450)


def _frames(logz, sign: float = 1.0, interval: int = 1, steps: int = 700):  # type: ignore[no-untyped-def]
    return frames_at(interval, steps,
                     lambda s: {"loss": 2.5 + 0.01 * max(0, s - 500),
                                "final.logz": sign * logz(s)}, history=interval > 1)


@pytest.mark.parametrize("interval", [1, 10])
def test_a_rule_below_on_x_fires_where_the_rule_above_fires_on_minus_x(interval: int) -> None:
    down = by_rule(alerts_of(_frames(_falling, interval=interval), rules=[FALL]), "logz_fall")
    up = by_rule(alerts_of(_frames(_falling, -1.0, interval=interval), rules=[RISE]),
                 "logz_rise")
    assert len(down) == len(up) == 1, (down, up)
    d, u = down[0], up[0]
    assert 480 <= d.fired_step <= 560, d.fired_step  # ahead of the loss, which barely moved
    assert (d.fired_step, d.started_step) == (u.fired_step, u.started_step)
    assert d.value == pytest.approx(-u.value)
    assert d.value < 5.0  # in log Z's own terms, not mirrored
    assert d.evidence["below_baseline"] == pytest.approx(u.evidence["above_baseline"])
    assert d.evidence["baseline"] == pytest.approx(-u.evidence["baseline"])
    assert "above_baseline" not in d.evidence
    assert "below its baseline" in d.message and "above" not in d.message.split(":")[-1]


def test_a_steady_series_and_a_rise_do_not_fire_a_rule_below() -> None:
    rising = by_rule(alerts_of(_frames(lambda s: 12.0 - _falling(s)), rules=[FALL]),
                     "logz_fall")
    steady = by_rule(alerts_of(_frames(lambda s: 6.0 + _WANDER[s]), rules=[FALL]),
                     "logz_fall")
    assert rising == [] and steady == []


def test_a_step_down_that_holds_is_not_a_fall_running_away() -> None:
    """A garbage stretch drops log Z 3 nat at once for 40 steps, then it comes back: the
    20-step level straddles the drop for a few steps, not five in a row falling in both
    halves of 50 steps, and the 100-step level never gets 1.5 nat out."""
    def garbage(step: int) -> float:
        return 6.0 + _WANDER[step] - (3.0 if 460 <= step < 500 else 0.0)

    assert by_rule(alerts_of(_frames(garbage), rules=[FALL]), "logz_fall") == []
    # the same drop held for good is paged once the 100-step level is out (half of its
    # steps down, at 510; held since 460, the first sample under the limit)
    held = by_rule(alerts_of(_frames(lambda s: 6.0 + _WANDER[s] - (3.0 if s >= 460 else 0.0)),
                             rules=[FALL]), "logz_fall")
    assert [(a.started_step, a.fired_step) for a in held] == [(460, 510)]


def test_below_needs_a_margin_and_a_departure_may_have_no_floor() -> None:
    with pytest.raises(RuleError, match="below .* needs margin"):
        RuleSpec("x", "departure", "final.logz", params={"below": True})
    RuleSpec("x", "departure", "final.logz", params={"below": True, "margin": 1.0,
                                                      "floor": None})
    with pytest.raises(RuleError, match="floor must be a number or null"):
        RuleSpec("x", "departure", "final.logz", params={"floor": "low"})
    with pytest.raises(RuleError, match="floor must be a number"):
        RuleSpec("x", "baseline", "loss", params={"floor": None})


def test_a_non_finite_value_is_left_to_the_upward_rule() -> None:
    """log Z overflowing (inf) with the loss still finite: the upward departure pages it
    ("non-finite"); the rule below says nothing, rather than "fell below" a second time.
    With the mirror judged as any departure, both paged at 520."""
    def overflow(step: int) -> dict[str, float]:
        return {"loss": 2.5, "final.logz": float("inf") if step >= 500 else 6.0 + _WANDER[step]}

    fired = alerts_of(frames_at(1, 560, overflow), rules=[FALL, RISE])
    assert [(a.rule, a.fired_step) for a in fired] == [("logz_rise", 520)], fired
    assert "non-finite" in fired[0].message
