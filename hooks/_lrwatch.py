"""When a learning-rate change should not wait for the next scheduled sample.

An LR jump or a re-warm that climbs far past where the schedule had settled can diverge a
run within a few steps, sooner than the next sample at a wide interval: the step's scalars
would reach the collector after the fact. The learning rate is a host number (no tensor is
read), so the hooks check it after every step and sample the next step when it

* jumps: changes by more than ``JUMP`` x in one step (up or down), or
* climbs past ``CLIMB`` x the peak the schedule settled at (its highest value before
  ``SETTLE`` steps without a new high: a warm-up's end), and again at every further
  doubling (so a ramp is followed by a few samples, log2 of how far it goes).

A warm-up does not trigger the climb (nothing has settled yet) and a linear one doubles in
one step only at its very start; a decay or a cosine restart back to the settled peak never
triggers it. Pure Python, shared by the hooks and by the bench
that derives what a job sampling one step in k sends (``bench/scenario_frames.py``).
"""

from __future__ import annotations

import math

__all__ = ["CLIMB", "JUMP", "SETTLE", "LrWatch"]

JUMP = 2.0
CLIMB = 2.0
SETTLE = 100


class LrWatch:
    """Feed :meth:`step` every step's learning rate; it says when to sample the next."""

    def __init__(self) -> None:
        self.prev: float | None = None
        self.high = 0.0
        self.high_step = 0
        self.settled: float | None = None
        self.next_climb: float | None = None

    def step(self, step: int, lr: float) -> bool:
        """Record ``lr`` (the learning rate ``step`` used); True if the next step should be
        sampled."""
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) \
                or lr <= 0:
            return False
        lr = float(lr)
        prev, self.prev = self.prev, lr
        if lr > self.high:
            self.high, self.high_step = lr, step
        elif self.settled is None and step - self.high_step >= SETTLE:
            self.settled = self.high
            self.next_climb = CLIMB * self.high
        fire = prev is not None and (lr > JUMP * prev or lr * JUMP < prev)
        if self.next_climb is not None and lr > self.next_climb:
            fire = True
            while self.next_climb <= lr:
                self.next_climb *= 2.0
        return fire
