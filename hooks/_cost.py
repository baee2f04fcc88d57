"""The monitor's own cost, and the sampling interval that keeps it within a budget.

Every step end is timestamped (one ``time.perf_counter()``, no device access). From the
durations of recent *non-sampled* steps we know what a step costs without the monitor
(the median). A sampled step's extra cost is

* on CPU (the model on the CPU: every statistic is computed by the hooks' own thread):
  the **thread CPU time** spent inside the monitor's hooks on that step
  (``time.thread_time()``). Other processes on the machine slow the wall clock of a
  sampled step, not this: a busy machine no longer reads as an expensive monitor;
* on an accelerator: the sampled step's duration minus that median (the device work the
  statistics queue is invisible to host timers; the step's one transfer waits for it),
  and never less than the hooks' thread CPU time.

With an overhead budget ``b`` (a fraction of training time, default 0.01) the interval is
widened to at least ``ceil(extra / (b · step))``, **at most** ``max_interval`` steps
(default :data:`MAX_INTERVAL`, 50: a frame at least every 50 steps, whatever the cost;
``hooks.overhead`` then says what it costs), and narrowed back toward the requested
interval when sampled steps get cheaper (median of the last 5).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

__all__ = ["CostMeter", "thread_clock"]

#: The clock of the monitor's own cost: CPU time of the training thread, which other
#: processes on the machine do not inflate (what every hook times itself with).
thread_clock = time.thread_time

#: Default ceiling on the interval the budget may widen to (steps between samples).
MAX_INTERVAL = 50


class CostMeter:
    """Step timing, the monitor's measured cost, and the budgeted interval."""

    def __init__(self, budget: float | None, window: int = 32,
                 max_interval: int = MAX_INTERVAL, device_work: bool = False) -> None:
        self.budget = budget
        self.max_interval = max_interval
        self.device_work = device_work  # statistics run on an accelerator
        self._last_end: float | None = time.perf_counter()  # step 0 starts at attach
        self._plain: deque[float] = deque(maxlen=window)
        self._extra: deque[float] = deque(maxlen=5)
        self._host = 0.0  # seconds inside hooks during the current step
        self._host_last = 0.0
        self.last_extra: float | None = None
        self.last_sampled_duration: float | None = None
        self._warm = False  # the first sampled step (allocations, lazy imports) is not typical

    def add_host(self, seconds: float) -> None:
        """Count ``seconds`` of monitor work on the current step (thread CPU time)."""
        self._host += seconds

    @property
    def host_seconds(self) -> float:
        """Thread CPU seconds inside the monitor so far on the current step."""
        return self._host

    def step_end(self, sampled: bool, now: float | None = None) -> None:
        """Record the end of a step (called once per step)."""
        now = time.perf_counter() if now is None else now
        last, self._last_end = self._last_end, now
        host, self._host = self._host, 0.0
        if last is None:
            return
        duration = now - last
        if not sampled:
            self._plain.append(duration)
            return
        if not self._warm:
            self._warm = True
            return
        self._host_last = host
        self.last_sampled_duration = duration
        if self.device_work and len(self._plain) >= 3:
            extra = max(host, duration - statistics.median(self._plain))
        else:
            extra = host
        self.last_extra = extra
        self._extra.append(extra)

    def step_seconds(self) -> float | None:
        """Typical step duration without the monitor (None until known)."""
        if len(self._plain) >= 3:
            return statistics.median(self._plain)
        if self.last_sampled_duration is not None:
            return max(1e-9, self.last_sampled_duration - self._host_last)
        return None

    def interval(self, requested: int) -> int:
        """The interval to use: ``requested``, widened as far as the budget needs, up to
        ``max_interval`` (a larger ``requested`` is kept)."""
        if self.budget is None or not self._extra:
            return requested
        step = self.step_seconds()
        if not step:
            return requested
        extra = statistics.median(self._extra)
        need = math.ceil(extra / (self.budget * step) - 1e-9) if extra > 0 else 1
        return max(requested, min(self.max_interval, need))

    def overhead(self, interval: int) -> float | None:
        """Estimated fraction of training time spent on monitoring at ``interval``."""
        step = self.step_seconds()
        if not self._extra or not step:
            return None
        return statistics.median(self._extra) / (interval * step)
