"""A rule keeps only the samples its kind reads (``Kind.keep``): the kinds that judge each
value alone, or keep what they need apart (``nonfinite``, ``threshold``, ``first_loss``,
``above_peak``), hold one sample a run-level cell, ``lr_jump`` the four it compares, the
window kinds their 1,024 steps. What they fire on is unchanged (the recorded runs' alerts
were compared field for field: bench/README.md, *The alert engine's memory per (run,
rank)*)."""

from __future__ import annotations

import math
from collections import deque

from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.detectors import KINDS
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.scalar_kinds import LR_JUMP_READS
from logitwatch.server.alerts.series import SCALAR_KEEP
from tests.alert_frames import alerts, feed, frame


def test_each_kind_keeps_what_it_reads(sessions: sessionmaker[Session]) -> None:
    eng = AlertEngine(DEFAULT_RULES)
    n = SCALAR_KEEP + 100
    lr = [1e-3] * n
    lr[n - 60:] = [2e-2] * 60  # a twentyfold step, late: after the deques are full
    loss = [3.0 - 1e-4 * i for i in range(n)]
    loss[n - 20] = math.nan
    feed(sessions, eng, [frame(i, loss=loss[i], lr=lr[i], **{"grad.norm": 1.0})
                         for i in range(n)])
    fired = {(a.rule, a.fired_step) for a in alerts(sessions)}
    # the kinds that keep one sample, or four, still fire where they did
    assert ("lr_jump", 10 * (n - 60)) in fired and ("lr_above_peak", 10 * (n - 60)) in fired
    assert ("loss_nonfinite", 10 * (n - 20)) in fired
    kept = {rule: len(m.recent) for (rule, _run, _rank, layer, _head), m in eng._mem.items()
            if layer is None}
    rules = {r.name: r for r in DEFAULT_RULES}
    for name, size in kept.items():
        keep = KINDS[rules[name].kind].keep
        assert size <= (SCALAR_KEEP if keep is None else keep), (name, size)
    assert kept["lr_jump"] == LR_JUMP_READS and kept["loss_nonfinite"] == 1
    assert kept["first_loss"] == 1 and kept["lr_above_peak"] == 1
    assert kept["loss_jump"] > 1000  # a window kind keeps its steps


def test_rules_keeping_one_series_share_its_samples(sessions: sessionmaker[Session]) -> None:
    """Every rule that keeps the loss (or the gradient norm, or the LR) keeps the same
    ``(step, value)`` tuples, one per sample, not a copy each: most of what a (run, rank)
    costs the engine (``FrameView.pair``; bench_engine_memory.py: 1.49 -> 0.75 MB)."""
    eng = AlertEngine(DEFAULT_RULES)
    n = 300
    feed(sessions, eng, [frame(i, loss=3.0 - 1e-3 * i + 0.01 * (i % 7), lr=1e-3,
                               **{"grad.norm": 1.0 + 0.01 * (i % 5)}) for i in range(n)])
    rules = {r.name: r for r in DEFAULT_RULES}
    for metric in ("loss", "grad.norm"):
        keepers = [m for (rule, _run, _rank, layer, _head), m in eng._mem.items()
                   if layer is None and rules[rule].metric == metric and len(m.recent) > 100]
        assert len(keepers) >= 3, (metric, len(keepers))
        tuples = {id(p) for m in keepers for p in m.recent}
        values = {p for m in keepers for p in m.recent}
        assert len(tuples) == len(values), (metric, len(tuples), len(values))
        # the gradient rules' other series (``extra``) hold the same tuples as well
        extra = [p for m in eng._mem.values() for d in m.extra.values()
                 if isinstance(d, deque) for p in d if p in values]
        assert all(id(p) in tuples for p in extra)
        assert extra or metric == "loss", metric
