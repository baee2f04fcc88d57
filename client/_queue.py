"""The bounded in-memory frame queue, its drop policy and its counters.

Frames wait here between :meth:`Client.send` (training thread) and the sender thread.
Policy when full: **drop the oldest** frame, so the latest health state always gets
through, and count it in ``dropped_queue_full``. :meth:`FrameQueue._overflow` is the one
place that decides what happens to an evicted frame; the disk spool plugs in there.

The sender takes a batch out of the queue (it is then *in flight*) and reports back with
:meth:`FrameQueue.done`. A batch that must be retried stays in flight, so memory is
bounded by ``max_queue + max_batch`` frames. Frames leave the queue in ``seq`` order,
which is what lets :meth:`FrameQueue.wait_handled` answer "was everything up to ``seq``
delivered?" exactly.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

__all__ = ["COUNTERS", "FrameQueue"]

Frame = dict[str, Any]

#: Counter names exposed by ``Client.stats`` (all frame counts except ``batches`` and
#: ``retries``).
COUNTERS = (
    "queued",  # frames accepted by send()
    "sent",  # frames delivered (2xx answer)
    "batches",  # batches delivered
    "retries",  # failed attempts that were retried (connection error, 429, 5xx)
    "dropped_queue_full",  # oldest frames evicted because the queue was full
    "rejected",  # frames in batches the collector refused with a 4xx other than 429
    "dropped_after_shutdown",  # frames sent after shutdown()
    "undelivered_at_shutdown",  # frames still waiting when shutdown() gave up
    "discarded",  # frames given to a client without a URL
)


class _Waiter:
    __slots__ = ("ok", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.ok = True


class FrameQueue:
    """A thread-safe bounded FIFO of ``(seq, frame)`` pairs with counted drops."""

    def __init__(self, max_queue: int) -> None:
        self._max = max_queue
        self._items: deque[tuple[int, Frame]] = deque()
        self._inflight: list[tuple[int, Frame]] = []
        self._cond = threading.Condition(threading.Lock())
        self._last_seq = -1
        self._waiters: list[_Waiter] = []
        self._counts = dict.fromkeys(COUNTERS, 0)

    # -- producer side (training thread): O(1), never blocks beyond a short lock ----------

    def put(self, seq: int, frame: Frame) -> int:
        """Append a frame; evict the oldest if full. Returns the number now waiting."""
        with self._cond:
            if len(self._items) >= self._max:
                old_seq, old_frame = self._items.popleft()
                self._overflow(old_seq, old_frame)
            self._items.append((seq, frame))
            self._last_seq = seq
            self._counts["queued"] += 1
            return len(self._items)

    def _overflow(self, seq: int, frame: Frame) -> None:
        """Decide the fate of a frame evicted from a full queue (lock held).

        Today: drop and count. The disk spool replaces this with "spill to disk", dropping
        only when its own budget is exhausted.
        """
        del frame
        self._counts["dropped_queue_full"] += 1
        self._lost(seq)

    # -- consumer side (sender thread) ---------------------------------------------------

    def take(self, n: int) -> list[Frame]:
        """Return the batch in flight, or move up to ``n`` oldest frames in flight first.

        Empty if nothing is waiting.
        """
        with self._cond:
            if not self._inflight:
                while self._items and len(self._inflight) < n:
                    self._inflight.append(self._items.popleft())
            return [frame for _, frame in self._inflight]

    def done(self, *, delivered: bool) -> None:
        """Settle the in-flight batch: delivered, or rejected by the collector."""
        with self._cond:
            batch, self._inflight = self._inflight, []
            if not batch:  # already abandoned by shutdown
                return
            if delivered:
                self._counts["sent"] += len(batch)
                self._counts["batches"] += 1
            else:
                self._counts["rejected"] += len(batch)
                for seq, _ in batch:
                    self._lost(seq)
            self._cond.notify_all()

    def abandon(self, counter: str) -> int:
        """Drop everything waiting or in flight, counted under ``counter``."""
        with self._cond:
            lost = self._inflight + list(self._items)
            self._inflight, self._items = [], deque()
            self._counts[counter] += len(lost)
            for seq, _ in lost:
                self._lost(seq)
            self._cond.notify_all()
            return len(lost)

    def count(self, counter: str, n: int = 1) -> None:
        with self._cond:
            self._counts[counter] += n

    # -- observers -----------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def pending(self) -> int:
        """Frames not yet settled (waiting plus in flight)."""
        with self._cond:
            return len(self._items) + len(self._inflight)

    def waiting(self) -> int:
        with self._cond:
            return len(self._items)

    def counts(self) -> dict[str, int]:
        with self._cond:
            return dict(self._counts)

    def wait_handled(self, target: int, timeout: float) -> bool:
        """Wait until every frame with ``seq <= target`` is settled.

        Returns True iff that happened within ``timeout`` and none of the frames that
        were pending when the call started was lost (dropped or rejected).
        """
        deadline = time.monotonic() + max(0.0, timeout)
        waiter = _Waiter(target)
        with self._cond:
            self._waiters.append(waiter)
            try:
                while self._lowest_pending() <= target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return waiter.ok
            finally:
                self._waiters.remove(waiter)

    def _lowest_pending(self) -> int:
        if self._inflight:
            return self._inflight[0][0]
        if self._items:
            return self._items[0][0]
        return self._last_seq + 1

    def _lost(self, seq: int) -> None:
        for waiter in self._waiters:
            if seq <= waiter.target:
                waiter.ok = False
