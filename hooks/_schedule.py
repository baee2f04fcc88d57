"""The :class:`~logitwatch.hooks._monitor.Monitor`'s sampling schedule, as seen from outside:
the current step, whether it is sampled, the requested and effective intervals, the
overhead budget, requests to sample (or max-measure) a coming step, and, once a step has
ended, the next step's schedule (``_reschedule``; ``_agree`` where ranks agree on it)."""

from __future__ import annotations

__all__ = ["ScheduleMixin"]


class ScheduleMixin:
    """The sampling schedule of :class:`~logitwatch.hooks._monitor.Monitor` (its state lives
    there)."""

    @property
    def step_index(self) -> int:
        """The index of the current (not yet ended) step (the first is
        ``attach(start_step=)``, default 0)."""
        return self._step

    @property
    def sampled(self) -> bool:
        """Whether the current step is sampled."""
        return self._sampled and "step" not in self.disabled

    @property
    def _scheduled(self) -> bool:
        """Whether the current step is sampled in the schedule. Under sharding the ranks'
        schedules never diverge, so a rank whose "step" part failed (it sends nothing)
        still gathers what the end-of-step exchange needs from it."""
        if self._shard is not None or self._ranks is not None:
            return self._sampled
        return self.sampled

    @property
    def sample_every(self) -> int:
        """The requested interval: the collector's ``control["sample_every"]`` if set,
        else the last value assigned here or given to ``attach``. The interval in effect
        (:attr:`effective_sample_every`) may be wider to respect the overhead budget."""
        value = self.client.control.get("sample_every")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        return self._sample_every

    @sample_every.setter
    def sample_every(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"sample_every must be an int >= 1, got {value!r}")
        self._sample_every = value
        self._interval_changed()

    @property
    def effective_sample_every(self) -> int:
        """The interval in effect: :attr:`sample_every`, widened by the overhead budget."""
        return self._effective_every

    @property
    def overhead_budget(self) -> float | None:
        """Fraction of training time the monitor may use (None: no limit)."""
        return self._cost.budget

    @overhead_budget.setter
    def overhead_budget(self, value: float | None) -> None:
        if value is not None and not (isinstance(value, (int, float)) and 0 < value <= 1):
            raise ValueError(f"overhead_budget must be in (0, 1] or None, got {value!r}")
        self._cost.budget = None if value is None else float(value)
        self._interval_changed()

    def _interval_changed(self) -> None:
        """A setter changed the requested interval or the budget. Under sharding or
        reduction the interval state only: whether the current step is sampled was agreed
        by every rank when the previous step ended and is never changed here (a step
        un-sampled, or sampled, on one rank only would make the ranks' collectives
        mismatch); the new value is proposed at the next agreement. On one process the
        schedule is decided again only between steps (no forward of the current step
        yet), never for a step in progress."""
        if self._shard is not None or self._ranks is not None:
            return
        if self._forwards == self._step_forwards and not self._depth:
            self._reschedule()
            return
        try:
            self._effective_every = self._cost.interval(self.sample_every)
        except Exception:
            self._fail("step")

    def request_sample(self) -> None:
        """Sample the next step to start, whatever the interval (e.g. after an alert)."""
        self._force_next = True

    def request_max(self, below: float | None = None) -> None:
        """Measure the next step's per-head max logit only, if it is not sampled (a fuse
        acting: ``hooks/_maxlogit.py``), into :attr:`maxima`; ``below``: the CPU screen."""
        self._max_next, self._max_below = True, below

    def request_sample_at(self, step: int) -> None:
        """Sample the step with index ``step`` (as :attr:`step_index`: counted from
        ``attach(start_step=)``), whatever the interval: e.g. a run's known last step, so that
        its final frame is a full sample (the framework callbacks do this). A step that
        has already started (``step <= step_index``) is not changed. Under sharding, call
        it on every rank alike. At most 64 requests are kept."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"request_sample_at: step must be an int, got {step!r}")
        if step > self._step and len(self._sample_at) < 64:
            self._sample_at.add(step)

    def _reschedule(self, agree: bool = False) -> None:
        try:
            proposal = self._cost.interval(self.sample_every)
        except Exception:
            proposal = self._effective_every
            self._fail("step")
        ranks = self._ranks
        if self._shard is None and ranks is None:
            self._effective_every = proposal
        elif agree:  # the end of a sampled step, on every rank alike
            self._agree(proposal)
        if ranks is not None and not agree:
            force = False  # waits for the next agreement: every rank samples alike
        else:
            force, self._force_next = self._force_next, False
        if self._sample_at:
            force = force or self._step in self._sample_at
            self._sample_at = {s for s in self._sample_at if s > self._step}
        self._sampled = (
            force
            or self._last_sampled is None
            or self._step >= self._last_sampled + self._effective_every
        )

    def _agree(self, proposal: int) -> None:
        """The end of a sampled step under sharding or reduction, on every rank alike: the
        next interval and requests to sample, agreed over the reduce group (``_reduce``),
        then over the sharding group where it is wider than the reduce group (its exchange
        needs every rank of it to sample alike), each collective entered whatever failed."""
        ranks, shard = self._ranks, self._shard
        if ranks is not None:  # requests to sample are agreed too (``_reduce``)
            try:
                floor = self._cost.interval(1)  # what this rank's budget needs
            except Exception:
                floor = 1
            try:
                self._effective_every, self._force_next = ranks.agree(
                    proposal, self._force_next, self.client.control, floor)
            except Exception:
                self._force_next = False
                self._warn_once("interval", "the ranks' interval agreement failed")
        if shard is not None and (ranks is None or ranks.agree_shard):
            every = proposal if ranks is None else self._effective_every
            try:
                self._effective_every, force = shard.agree_schedule(every, self._force_next)
                self._force_next = force
            except Exception:
                self._force_next = self._force_next and ranks is None
                self._warn_once("interval", "the ranks' interval agreement failed")
