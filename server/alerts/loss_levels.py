"""The level trackers of a (run, rank) that hold a firing alert back or let it go: how far
the loss has risen above its best, how much of a bump it has won back and how far the
learning rate has climbed (:class:`_LossRise`, for a rule's :class:`~.rules.Downgrade`), and
a series' recent level (:class:`_Level`, for its ``Page.recover_within``).

:class:`~.state.RankState` keeps them (``_loss`` by :func:`_loss_key`, ``_levels`` by
:func:`_level_key`); :mod:`.evaluate` feeds them each step's values, :mod:`.lifecycle` and
:mod:`.recovery` read them, and what a loss tracker holds of the whole run (its first step
and best levels) is kept across restarts in ``rule_memory`` (:mod:`.rule_memory`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median

from logitwatch.server.alerts.rules import Downgrade, RuleSpec

__all__ = ["LOSS_MIN_SAMPLES", "RECOVER_MIN_SAMPLES"]

LOSS_MIN_SAMPLES = 5  # the fewest loss samples a downgrade's loss median is taken over
RECOVER_MIN_SAMPLES = 3  # the fewest samples each span of a recovery test is taken over


def _loss_key(run_id: int, rank: int, d: Downgrade) -> tuple[int, int, int, int]:
    """The key of the loss-rise tracker a downgrade ``d`` reads on (run, rank)."""
    return run_id, rank, d.loss_window, d.recover_span or 0


def _level_key(run_id: int, rank: int, rule: RuleSpec) -> tuple[int, int, str, int]:
    """The key of the level tracker a rule's ``Page.recover_within`` reads on (run, rank)."""
    assert rule.page is not None
    return run_id, rank, rule.metric, rule.page.recover_steps


@dataclass(slots=True)
class _Level:
    """The level of one scalar series of a (run, rank): the median of its values over the
    newest ``steps`` steps, or of its newest :data:`RECOVER_MIN_SAMPLES` samples where a
    wide sampling interval without every step's history gives fewer, taken over the steps
    after an episode started (``Page.recover_within``: whether a held-back episode has
    recovered). A non-finite value counts as infinitely high."""

    steps: int
    recent: deque[tuple[int, float]] = field(default_factory=deque)

    def push(self, step: int, v: float) -> None:
        if self.recent and step <= self.recent[-1][0]:
            return  # a step seen already (a restored history overlapping the stream)
        self.recent.append((step, v if math.isfinite(v) else math.inf))
        while (len(self.recent) > RECOVER_MIN_SAMPLES
               and self.recent[0][0] <= step - self.steps):
            self.recent.popleft()

    def level(self, since: int) -> float | None:
        """The median of the newest values of the steps after ``since`` (None under
        :data:`RECOVER_MIN_SAMPLES` of them)."""
        vals = [x for s, x in self.recent if s > since]
        if len(vals) < RECOVER_MIN_SAMPLES:
            return None
        return float(median(vals))


@dataclass(slots=True)
class _LossRise:
    """How far the median of the loss over the last ``span`` steps sits above the lowest
    such median of the run (a run's loss-side harm, for :class:`~.rules.Downgrade`). At a
    wide sampling interval without every-step history the median takes the newest
    :data:`LOSS_MIN_SAMPLES` samples; it counts once the run has ``span`` steps of loss.

    ``level`` (``Downgrade.recover_span``): ``won_back`` is the share of a bump the loss has
    won back: how far its level (the median of its newest ``level`` steps) has come down
    from the highest level it had within the last ``span`` steps, over that peak's height
    above the run's best level (0.0 with no bump, or under :data:`RECOVER_MIN_SAMPLES`
    samples in the level). The downgrade compares it with its own ``recover_share``.

    ``level_at(step)`` (``Downgrade.start_rise``): the level at ``step``, while the last
    ``span`` steps still hold it; ``now``: the newest level.

    ``lr_climb`` (``Downgrade.lr_climb``): the learning rate's newest value over its oldest
    within the last ``span`` steps, minus 1 (0.2: up 20 %), from every step's ``lr``."""

    span: int
    level: int | None = None
    recent: deque[tuple[int, float]] = field(default_factory=deque)
    levels: deque[tuple[int, float]] = field(default_factory=deque)  # (step, level)
    first: int | None = None
    best: float = math.inf
    best_level: float = math.inf
    rise: float = 0.0
    won_back: float = 0.0
    lrs: deque[tuple[int, float]] = field(default_factory=deque)  # (step, lr) over the span
    lr_climb: float = 0.0  # the LR's newest value over its oldest in the span, minus 1

    def push(self, step: int, v: float | None, lr: float | None = None) -> None:
        if lr is not None and math.isfinite(lr):
            self._push_lr(step, lr)
        if v is None:
            return
        if not math.isfinite(v):
            self.rise = math.inf  # a non-finite loss is harm
            self.won_back = 0.0
            return
        if self.first is None:
            self.first = step
        self.recent.append((step, v))
        while (len(self.recent) > LOSS_MIN_SAMPLES
               and self.recent[0][0] <= step - self.span):
            self.recent.popleft()
        if len(self.recent) >= LOSS_MIN_SAMPLES and step - self.first >= self.span - 1:
            m = median(x for _, x in self.recent)
            self.best = min(self.best, m)
            self.rise = m - self.best
        else:
            self.rise = 0.0
        if self.level is not None:
            self.won_back = self._won_back(step, self.level)

    @property
    def now(self) -> float | None:
        """The newest level (None before the first, or without ``level``)."""
        return self.levels[-1][1] if self.levels else None

    def level_at(self, step: int) -> float | None:
        """The level of the newest step at or before ``step`` that the last ``span``
        steps still hold (None: none left, or ``step`` before them all)."""
        out = None
        for s, x in self.levels:
            if s > step:
                break
            out = x
        return out

    def _push_lr(self, step: int, lr: float) -> None:
        self.lrs.append((step, lr))
        while len(self.lrs) > 1 and self.lrs[1][0] <= step - self.span:
            self.lrs.popleft()
        first = self.lrs[0][1]
        self.lr_climb = lr / first - 1.0 if first > 0 else 0.0

    def _won_back(self, step: int, level: int) -> float:
        newest = [x for s, x in self.recent if s > step - level]
        if len(newest) < RECOVER_MIN_SAMPLES:
            return 0.0
        now = median(newest)
        self.best_level = min(self.best_level, now)
        self.levels.append((step, now))
        while self.levels[0][0] <= step - self.span:
            self.levels.popleft()
        peak = max(x for _, x in self.levels)
        height = peak - self.best_level
        return (peak - now) / height if height > 0 else 0.0
