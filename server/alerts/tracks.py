"""The lifecycle of one cell's alert (:class:`Track`), the verdicts that drive it, and the
read access a detector has to the rest of the frame (:class:`FrameView`). Pure: no clock,
no I/O, no database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec

__all__ = ["FIRED_KEEP", "FrameView", "State", "Track", "Transition", "Verdict"]


class State(str, Enum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement: ``breach`` or not, with what it was judged on."""

    breach: bool
    value: float
    evidence: dict[str, Any] = field(default_factory=dict)
    baseline: float | None = None
    limit: float | None = None
    left_step: int | None = None  # where the series first left its range, if known
    # the first of the newest samples that all breach (a smoothed rule's raw samples): the
    # breach is known to have lasted since then, so ``for_steps`` counts from there (at a
    # wide interval one smoothed breach then needs no second sample ``for_steps`` later)
    held_from: int | None = None
    # whether this sample alone breaches, where the verdict judges a level (a smoothed
    # departure); None: the same as ``breach``. A kind that keeps breaching samples out of
    # its memory keeps out only these (a calm sample under a breaching level goes in)
    sample_breach: bool | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of an alert: ``firing`` (new, or ``reopened``: a breach within the hold
    of a firing alert, which updates that alert) or ``resolved``."""

    state: State
    step: int
    started_step: int
    verdict: Verdict
    reopened: bool = False


#: Firing steps a :class:`Track` keeps, for a page on repeated episodes (``Page.repeats``).
FIRED_KEEP = 8


@dataclass(slots=True)
class Track:
    """Lifecycle of one (rule, run, rank, cell): inactive -> pending -> firing -> resolved.

    Pending turns firing once the breach has lasted ``rule.for_samples`` samples and
    ``rule.for_steps`` steps. Firing resolves once the condition has been clear for
    ``rule.resolve_after`` samples and ``rule.hold`` steps (from the first clear sample,
    ``clear_since``); a breach before that keeps the alert firing and returns a
    ``reopened`` transition (one episode, one alert). ``last_breach`` is the newest breaching
    verdict and its step (what a :class:`~.spec.Page` policy reads).
    """

    state: State = State.INACTIVE
    streak: int = 0
    calm: int = 0
    started_step: int = 0
    clear_since: int | None = None
    streak_from: int = 0
    last_breach: tuple[int, Verdict] | None = None
    # its newest episodes (FIRED_KEEP at most): the step each fired and how far it jumped
    # then (value - baseline; None: no baseline)
    fired: tuple[tuple[int, float | None], ...] = ()

    def advance(self, rule: RuleSpec, step: int, v: Verdict) -> Transition | None:
        if v.breach:
            reopened = self.state is State.FIRING and self.calm > 0
            self.calm = 0
            self.clear_since = None
            self.streak += 1
            self.last_breach = (step, v)
            if self.streak == 1:
                self.streak_from = step if v.held_from is None else min(step, v.held_from)
                if self.state is not State.FIRING:
                    self.started_step = (v.left_step if v.left_step is not None
                                         else self.streak_from)
                    self.state = State.PENDING
            if (self.state is State.PENDING and self.streak >= rule.for_samples
                    and step - self.streak_from >= rule.for_steps):
                self.state = State.FIRING
                jump = None if v.baseline is None else v.value - v.baseline
                self.fired = (*self.fired[-(FIRED_KEEP - 1):], (step, jump))
                return Transition(State.FIRING, step, self.started_step, v)
            if reopened:
                return Transition(State.FIRING, step, self.started_step, v, reopened=True)
            return None
        self.streak = 0
        if self.state is State.PENDING:
            self.state = State.INACTIVE
        elif self.state is State.FIRING:
            self.calm += 1
            if self.clear_since is None or step < self.clear_since:  # (a job restarted
                self.clear_since = step  # from an earlier checkpoint counts from there)
            if self.calm >= rule.resolve_after and step - self.clear_since >= rule.hold:
                self.state = State.RESOLVED
                self.clear_since = None
                return Transition(State.RESOLVED, step, self.started_step, v)
        return None


class FrameView:
    """Read access to the other series of the sample being judged, and the one ``(step,
    value)`` tuple of each value the rules keep of it (:meth:`pair`)."""

    __slots__ = ("heads", "scalars", "_pairs")

    def __init__(self, scalars: Mapping[str, float],
                 heads: Mapping[str, list[list[float]]]) -> None:
        self.scalars = scalars
        self.heads = heads
        self._pairs: dict[tuple[int, float], tuple[int, float]] = {}

    def pair(self, step: int, x: float) -> tuple[int, float]:
        """The ``(step, x)`` sample, one tuple per distinct pair of this frame: the rules
        that keep the same series (the loss six times, the gradient norm seven, the LR
        seven) keep one tuple between them, a pointer each, instead of a tuple each
        (``bench/bench_engine_memory.py``: most of what a (run, rank) costs the engine)."""
        p = (step, x)
        return self._pairs.setdefault(p, p)

    def get(self, metric: str, layer: int | None = None, head: int | None = None) -> float | None:
        if layer is None:
            v = self.scalars.get(metric)
            return None if v is None else float(v)
        m = self.heads.get(metric)
        try:
            return None if m is None else float(m[layer][head])  # type: ignore[index]
        except (IndexError, TypeError):
            return None
