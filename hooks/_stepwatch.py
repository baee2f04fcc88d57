"""When a loss or gradient-norm spike should not wait for the next scheduled sample.

Every step's loss and gradient norm reach the collector in the next frame's ``history``
(:mod:`~logitwatch.hooks._history`), so the collector judges each step, but at a wide
interval it hears of a blow-up only when that frame comes: up to ``k`` steps late. The
hooks read each finished step's two numbers where that costs no sync (a CPU job: the values
are host memory; an accelerator job: a non-blocking copy to pinned memory, read once its
event says it is done, typically a step later) and sample the next step when

* the loss or the gradient norm is NaN or infinite (the first such step of a run of them);
* the gradient norm is more than ``GRAD_FACTOR`` x the median of the last ``WINDOW``
  finite norms (a spike a clip would have to bound);
* the loss is above the median of the last ``WINDOW`` finite losses by more than
  ``LOSS_Z`` robust deviations (1.4826 x MAD) and at least ``LOSS_MIN`` nats (the loss-jump
  rule's own test, so what pages is what was sampled),

at most ``BURST`` times within any ``REARM`` steps (a persisting blow-up is followed by a
sample on each of its first three anomalous steps, then by at most three in every ten; a
steady run never triggers). Three, because the collector's ``loss_jump`` decides a page on the
jump and the two steps after it (a second breach, or the gradient's aftershock): with one
sample per ``REARM`` steps, a blow-up whose jump came a step after the first trigger was
judged on time but heard of only at the next scheduled frame, up to ``k`` steps later.
Thresholds follow the collector's default ``grad_spike`` / ``loss_jump`` rules rather
than being fitted to any run. Pure Python, shared by the hooks and by the bench that
derives what a job sampling one step in k sends (``bench/scenario_frames.py``).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

__all__ = ["BURST", "GRAD_FACTOR", "LOSS_MIN", "LOSS_Z", "MIN_SEEN", "REARM", "WINDOW", "StepWatch"]

WINDOW = 64
MIN_SEEN = 16
GRAD_FACTOR = 10.0
LOSS_Z = 8.0
LOSS_MIN = 0.5
REARM = 10
BURST = 3


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


class StepWatch:
    """Feed :meth:`step` every finished step's loss and gradient norm (None where the step
    had none); it says when to sample the next step."""

    def __init__(self) -> None:
        self.losses: deque[float] = deque(maxlen=WINDOW)
        self.norms: deque[float] = deque(maxlen=WINDOW)
        self._fires: deque[int] = deque(maxlen=BURST)  # the last triggers' steps
        self.bad = False  # the previous step was non-finite
        self.fired = 0

    def _anomaly(self, loss: float | None, norm: float | None) -> bool:
        bad = any(v is not None and not math.isfinite(v) for v in (loss, norm))
        first_bad, self.bad = bad and not self.bad, bad
        if bad:
            return first_bad
        hit = False
        if norm is not None:
            if len(self.norms) >= MIN_SEEN:
                hit = norm > GRAD_FACTOR * median(self.norms)
            self.norms.append(norm)
        if loss is not None:
            if len(self.losses) >= MIN_SEEN:
                mid = median(self.losses)
                dev = 1.4826 * median(abs(x - mid) for x in self.losses)
                hit = hit or loss - mid > max(LOSS_Z * dev, LOSS_MIN)
            self.losses.append(loss)
        return hit

    def step(self, step: int, loss: object, norm: object) -> bool:
        """Record ``step``'s ``loss`` and gradient ``norm``; True if the next step should be
        sampled."""
        hit = self._anomaly(_finite(loss), _finite(norm))
        fires = self._fires
        if not hit or (len(fires) == BURST and step - fires[0] < REARM):
            return False
        fires.append(step)
        self.fired += 1
        return True
