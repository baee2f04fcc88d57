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
* the loss breaches the collector's default ``loss_jump`` test, as that rule judges it (so
  what pages is what was sampled): more than ``LOSS_Z`` robust deviations and ``LOSS_MIN``
  nats above the median of the newest ``LOSS_CENTER`` losses, the deviation taken from the
  step-to-step differences of the last ``LOSS_WINDOW`` (their MAD x 1.4826 / sqrt 2, at
  least ``LOSS_MIN_SCALE``), the half nat counted from the higher of that median and the
  whole window's, from the ``LOSS_MIN_SEEN``-th finite loss on. As in the rule's memory a
  breaching loss stays out of the window, so a garbage stretch or a blow-up is still a jump
  on its tenth step (its steps still sampled, at most ``BURST`` in ``REARM``), but for at
  most ``LOSS_HOLD`` steps of one episode (the rule's page horizon): a loss that stays up
  for good (a healthy level shift) then becomes the window's level and stops the samples,
  where a window that never took it would sample three steps in ten for the rest of the
  run. (Until round forty-seven the median and MAD of the last 64 losses: early in a run
  the window still held the warm-up's higher losses, its spread was wide, and a jump
  the collector paged on went unsampled: a page judged on step 63 reached it at step 70.)

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

__all__ = ["BURST", "GRAD_FACTOR", "LOSS_CENTER", "LOSS_HOLD", "LOSS_MIN", "LOSS_MIN_SCALE",
           "LOSS_MIN_SEEN", "LOSS_WINDOW", "LOSS_Z", "MIN_SEEN", "REARM", "WINDOW",
           "StepWatch"]

#: the gradient-norm test's window (finite norms) and the norms it needs first
WINDOW = 64
MIN_SEEN = 16
GRAD_FACTOR = 10.0
#: the collector's default ``loss_jump`` rule's parameters (``z``, ``min_jump``, ``window``,
#: ``center_window``; ``min_scale`` and ``min_samples`` of its kind): a test checks they
#: agree, so a change of the rule is a change here
LOSS_Z = 8.0
LOSS_MIN = 0.5
LOSS_WINDOW = 200
LOSS_CENTER = 20
LOSS_MIN_SCALE = 0.02
LOSS_MIN_SEEN = 5
#: steps a breaching loss is held out of the window, from the first breach of an episode:
#: the rule's page horizon (``Page.after`` of ``loss_jump``), within which the collector
#: decides whether the jump persists or recovers
LOSS_HOLD = 100
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
        self.losses: deque[float] = deque(maxlen=LOSS_WINDOW)
        self.norms: deque[float] = deque(maxlen=WINDOW)
        self._fires: deque[int] = deque(maxlen=BURST)  # the last triggers' steps
        self.bad = False  # the previous step was non-finite
        self._held_from = 0  # the first loss breach of the current episode
        self._last_jump: int | None = None  # the last loss breach
        self.fired = 0
        #: whether the last step fed to :meth:`step` was anomalous (sampled next or not)
        self.flagged = False

    def _anomaly(self, step: int, loss: float | None, norm: float | None) -> bool:
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
            jumped = len(self.losses) >= LOSS_MIN_SEEN and _loss_jump(list(self.losses), loss)
            if jumped:
                if self._last_jump is None or step - self._last_jump > REARM:
                    self._held_from = step  # a new episode: REARM calm steps ended the last
                self._last_jump = step
            if not jumped or step - self._held_from >= LOSS_HOLD:
                self.losses.append(loss)
            hit = hit or jumped
        return hit

    def step(self, step: int, loss: object, norm: object) -> bool:
        """Record ``step``'s ``loss`` and gradient ``norm``; True if the next step should be
        sampled. :attr:`flagged` says whether the step was anomalous at all, sampled next or
        not (past ``BURST`` in ``REARM``): its history is still worth sending at once, which
        costs a scalars-only frame, not a sample."""
        hit = self.flagged = self._anomaly(step, _finite(loss), _finite(norm))
        fires = self._fires
        if not hit or (len(fires) == BURST and step - fires[0] < REARM):
            return False
        fires.append(step)
        self.fired += 1
        return True


def _loss_jump(window: list[float], loss: float) -> bool:
    """The collector's ``loss_jump`` breach of ``loss`` after the finite losses ``window``
    (oldest first, at least ``LOSS_MIN_SEEN`` of them; ``server/alerts/scalar_kinds.spike``
    with ``center_window`` and ``noise: diff``, its scale ``series.diff_noise``). Written
    again here because the hooks never import the collector; the half-nat test goes first,
    so most steps cost one median of 20 and one of the window."""
    center = median(window[-LOSS_CENTER:])
    if loss - max(center, median(window)) <= LOSS_MIN:
        return False
    diffs = [b - a for a, b in zip(window, window[1:], strict=False)]
    mid = median(diffs)
    noise = median(abs(d - mid) for d in diffs) * 1.4826 / math.sqrt(2.0)
    return (loss - center) / max(noise, LOSS_MIN_SCALE) > LOSS_Z
