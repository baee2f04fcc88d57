"""``grad_norm_climb`` (the ``level_rise`` kind's ``climb_factor``, ``climb_span``, ``climbs``
and ``low_window``) through the real ingest and engine: a gradient norm whose level keeps
climbing pages, one that jumps and holds does not, and a stretch of zero gradients sets no
lowest level that every later level is a multiple of. (The parameters' checks:
``tests/test_alerts_rules.py``, with every kind's.)"""

from __future__ import annotations

import pytest

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.rules import RuleSpec
from tests.alert_frames import alerts_of, frames_at

CLIMB = [r for r in DEFAULT_RULES if r.name == "grad_norm_climb"]


def _growing(step: int) -> dict[str, float]:
    """0.5 until step 400, then 3.2 % more each step: x2.57 every 30 steps (an LM head
    running away), 10x its settled level by about step 473."""
    return {"grad.norm": 0.5 if step < 400 else 0.5 * 1.032 ** (step - 400)}


def _jump_and_hold(step: int) -> dict[str, float]:
    """0.5, then 20x for 40 steps from step 400 (a stretch of bad batches), then 0.5."""
    return {"grad.norm": 10.0 if 400 <= step < 440 else 0.5}


def _zeros_then_rise(step: int) -> dict[str, float]:
    """0.5, no gradient at all for 150 steps (all-zero batches), 0.5 again, then from step
    700 up x2.6 every 30 steps for 60 steps and held there (3.4: 6.8x the settled 0.5)."""
    if 300 <= step < 450:
        return {"grad.norm": 0.0}
    return {"grad.norm": 0.5 * 1.032 ** min(max(step - 700, 0), 60)}


@pytest.mark.parametrize("k", [1, 50])
def test_a_level_still_climbing_pages(k: int) -> None:
    got = [a for a in alerts_of(frames_at(k, 600, _growing, history=True), DEFAULT_RULES)
           if a.rule == "grad_norm_climb"]
    assert len(got) == 1, got
    a = got[0]
    assert a.severity == "warning" and 465 <= a.fired_step <= 495, (a.fired_step, a.severity)
    assert a.evidence["lowest_level"] == pytest.approx(0.5)
    assert min(a.evidence["climb"]) >= 2.5, a.evidence
    assert "still climbing: x" in a.message and "last 2 spans of 30 steps" in a.message, \
        a.message


@pytest.mark.parametrize("k", [1, 50])
def test_a_jump_that_holds_is_no_climb(k: int) -> None:
    """20x its level for 40 steps rises in one span, not two: no alert (the level rule at 10x
    alone would have fired)."""
    frames = frames_at(k, 600, _jump_and_hold, history=True)
    assert [a.rule for a in alerts_of(frames, CLIMB)] == []
    alone = [RuleSpec("level_only", "level_rise", "grad.norm", severity="warning",
                      params={**CLIMB[0].params, "climb_factor": None})]
    assert [a.fired_step for a in alerts_of(frames, alone)] == [410], "the 10x level"


def test_no_gradient_at_all_sets_no_lowest() -> None:
    """150 steps of zero gradient make the 100-step level 0: were it a lowest, every later
    level would be 'x inf' above it and the rise after step 700 (6.8x the settled 0.5,
    climbing 2.6x twice) would page."""
    frames = frames_at(1, 900, _zeros_then_rise, history=True)
    assert [a.rule for a in alerts_of(frames, CLIMB)] == []
