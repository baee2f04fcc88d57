"""Alert rules as pure state machines over sampled values (no clock, no I/O).

``attn_logit_rising``: a head's max attention logit is alarming when it is non-finite, above
an absolute ``threshold``, or above ``factor`` x the head's own baseline (and above
``floor``), for ``for_samples`` consecutive sampled steps. The baseline is the median of
the head's last ``window`` samples, skipping the ``lag`` most recent ones so that a steady
climb cannot drag its own baseline up; samples that breach are kept out of the baseline.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from statistics import median

__all__ = ["HeadState", "LogitRisingRule", "State", "Transition", "REMEDIES"]

REMEDIES: list[str] = [
    "Add QK-norm (RMSNorm over head_dim on q and k) or an attention-logit soft-cap "
    "(cap * tanh(logits / cap), e.g. cap 50).",
    "QK-clip: rescale W_q and W_k of the offending head when its max logit exceeds tau "
    "(e.g. 100); with biased q/k projections scale the biases too, or they grow while the "
    "weights shrink.",
    "Add z-loss (1e-4 * log^2 Z) if the output logits drift as well.",
    "Lower the learning rate (or lengthen warm-up).",
    "Restart from a checkpoint about 100 steps before the rise and skip the next batches.",
]


class State(str, Enum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of state that people must hear about: firing or resolved."""

    state: State
    step: int
    started_step: int
    value: float
    baseline: float | None
    limit: float


@dataclass(slots=True)
class HeadState:
    """What the rule remembers about one (run, rank, layer, head)."""

    history: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    state: State = State.INACTIVE
    streak: int = 0
    calm: int = 0
    started_step: int = 0


@dataclass(frozen=True, slots=True)
class LogitRisingRule:
    name: str = "attn_logit_rising"
    metric: str = "attn.logit_max"
    threshold: float = 1000.0
    factor: float = 4.0
    floor: float = 30.0
    for_samples: int = 3
    window: int = 20
    lag: int = 5
    min_history: int = 5

    def baseline(self, st: HeadState) -> float | None:
        past = list(st.history)[: max(0, len(st.history) - self.lag)][-self.window :]
        return median(past) if len(past) >= self.min_history else None

    def limit(self, baseline: float | None) -> float:
        if baseline is None:
            return self.threshold
        return min(self.threshold, max(self.floor, self.factor * baseline))

    def evaluate(self, st: HeadState, step: int, value: float) -> Transition | None:
        """Advance ``st`` by one sampled value; return a transition when one happens."""
        base = self.baseline(st)
        limit = self.limit(base)
        breach = not math.isfinite(value) or value > limit
        out: Transition | None = None
        if breach:
            st.calm = 0
            st.streak += 1
            if st.streak == 1 and st.state is not State.FIRING:
                st.started_step = step
                st.state = State.PENDING
            if st.streak >= self.for_samples and st.state is State.PENDING:
                st.state = State.FIRING
                out = Transition(State.FIRING, step, st.started_step, value, base, limit)
        else:
            st.streak = 0
            if st.state is State.PENDING:
                st.state = State.INACTIVE
            elif st.state is State.FIRING:
                st.calm += 1
                if st.calm >= self.for_samples:
                    st.state = State.RESOLVED
                    out = Transition(State.RESOLVED, step, st.started_step, value, base, limit)
            if math.isfinite(value):
                st.history.append(value)
        return out
