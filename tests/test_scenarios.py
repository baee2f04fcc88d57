"""The recorded alert scenarios: their labels, and the default rules' results on them.

The suite in ``bench/scenarios`` is the evidence for the default rules (docs/ALERTS.md,
*Evidence*); these tests keep the labels honest (they follow the stated rule on every step's
loss) and keep the defaults to the targets they were chosen for: every diverging run caught
no later than its divergence step, at least 50 steps ahead wherever a signal other than the
loss led by 50, no alarm on a healthy run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from logitwatch.demo.train import divergence_step

BENCH = Path(__file__).resolve().parent.parent / "bench"
FILES = sorted((BENCH / "scenarios").glob("*.jsonl"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rec() -> ModuleType:
    return _load("record_scenarios")


def test_regression_and_outcome(rec: ModuleType) -> None:
    flat = [3.0] * 300
    assert rec.regression(flat) == 0.0
    assert rec.regression(flat[:50]) == 0.0  # shorter than the window
    # down to 2.0, then back up to 2.4 for the last 100 steps: 0.4 nat given back
    down_up = [3.0] * 100 + [2.0] * 200 + [2.4] * 100
    assert rec.regression(down_up) == pytest.approx(0.4)
    assert rec.outcome(down_up, None) == "degraded"
    # a bump that recovers ends where it was: healthy
    bump = [2.0] * 200 + [2.8] * 50 + [2.0] * 150
    assert rec.regression(bump) == pytest.approx(0.0, abs=1e-9)
    assert rec.outcome(bump, None) == "healthy"
    assert rec.outcome(bump, 210) == "diverging"
    assert rec.regression([*flat, math.nan]) == 0.0
    slight = [2.0] * 200 + [2.2] * 100
    assert rec.outcome(slight, None) == "healthy"  # 0.2 < 0.25


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_recorded_labels_follow_the_rule(rec: ModuleType) -> None:
    labels = {}
    for path in FILES:
        h = json.loads(path.read_text().partition("\n")[0])
        losses = [float(x) for x in h["losses"]]
        assert h["divergence_step"] == divergence_step(losses), path.name
        assert h["label"] == rec.outcome(losses, h["divergence_step"]), path.name
        assert h["regression"] == round(rec.regression(losses), 4), path.name
        labels[h["scenario"]] = h["label"]
    # every kind of run is there
    assert {"diverging", "degraded", "healthy"} <= set(labels.values())


@pytest.mark.skipif(not FILES, reason="no recorded scenarios")
def test_default_rules_meet_the_targets_on_the_suite() -> None:
    ba = _load("bench_alerts")
    from logitwatch.server.alerts.replay import read_frames

    rows = []
    for path in FILES:
        header, frames = read_frames(path)
        assert header is not None
        rows.append(ba.logitwatch_row(header, frames))
    s = ba.summarize("logitwatch", rows, lambda r: r["logitwatch"])
    div = sum(r["label"] == "diverging" for r in rows)
    healthy = sum(r["label"] == "healthy" for r in rows)
    missed = [r["scenario"] for r in rows if r["label"] == "diverging" and
              (r["logitwatch"] is None or r["logitwatch"] > r["divergence_step"])]
    assert s["recall"] == f"{div}/{div}", missed
    assert s["false_alarm_runs"] == f"0/{healthy}", s["false_alarms"]
    assert s["late"] == [], s["late"]
