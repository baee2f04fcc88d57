"""The two background threads of a client: the sender (network) and the spooler (disk).

Sender loop (the ``while not stop: wait(interval)`` idiom): wait ``interval``, or until
woken because a batch is full or a flush was asked for, then send batches of up to
``max_batch`` frames, oldest first, until nothing waits. A batch that fails is handed to
the backlog (which spools it) and the next attempt waits ``backoff_delay(attempt)``; that
wait is cut short by ``flush()`` and ``shutdown()`` but not by new frames, so a down
collector is not hammered. While stopping, it keeps trying until the shutdown deadline,
waiting at most a second between two attempts.

One frame never takes its batch with it: a batch refused as invalid (4xx), or answered 500
(or 409) three times in a row, is sent in halves, and halves of the halves that fail; the
frames refused alone are set aside in the spool directory (``.rejected``, ``.quarantine``,
never replayed), counted, and logged once per cause; the rest is delivered. A 500 is
blamed on a frame only if other frames of the batch went through: a collector failing on
everything is an outage, and the batch waits.

Spooler loop: keeps the disk spool fed so that the sender, which may sit for seconds in
one slow request, never makes the training thread wait or drop: when memory passes half
of its bounds it writes the oldest frames down to a quarter; while the collector is
unreachable it writes everything in memory every ``spool_interval``; and every half
``spool_interval`` it writes the frames, and the batch in flight, that were already queued
half an interval before and are still not delivered. So a crash of the job loses at most
``spool_interval`` seconds of frames, however slow the collector.

Neither thread ever lets an exception out: a bug is logged, and the client degrades
instead of breaking the training job.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ._http import IngestTransport, Outcome, backoff_delay, failure_hint
from ._queue import Backlog, Batch, _seq, warn_once

__all__ = ["Sender", "Spooler"]

log = logging.getLogger("logitwatch.client")

#: Longest wait between two attempts while shutting down (within its timeout).
SHUTDOWN_BACKOFF = 1.0

#: A batch answered 500 this many times in a row is sent in halves to find the frame the
#: collector fails on (again after as many more).
POISON_AFTER = 3


class Sender:
    """Owns the daemon thread that moves frames from a :class:`Backlog` to the collector."""

    def __init__(
        self,
        backlog: Backlog,
        transport: Callable[[], IngestTransport],
        *,
        max_batch: int,
        interval: float,
        max_backoff: float,
        on_answer: Callable[[dict[str, Any]], None],
        on_down: Callable[[], None],
    ) -> None:
        self._backlog = backlog
        self._make_transport = transport
        self._transport: IngestTransport | None = None
        self._max_batch = max_batch
        self._interval = interval
        self._max_backoff = max_backoff
        self._on_answer = on_answer
        self._on_down = on_down
        self._wake = threading.Event()  # a batch is full, a flush or shutdown
        self._urgent = threading.Event()  # cut a backoff wait short (flush, shutdown)
        self._stopping = False
        self._deadline = float("inf")
        self._warned: set[str] = set()
        self._failing = (-1, 0)  # (first seq of the batch that failed with 500, times)
        # What _isolate learnt about the batch starting at _progress_first, kept across
        # attempts: seqs stored, and frames set aside (seq -> kind, line, cause, message).
        self._progress_first = -1
        self._stored: set[int] = set()
        self._aside: dict[int, tuple[str, bytes, str, str]] = {}
        self._duplicates = 0
        self.endpoint = ""
        self._thread = threading.Thread(target=self._run, name="logitwatch-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, *, urgent: bool = False) -> None:
        """Send now instead of at the next tick; ``urgent`` also ends a backoff wait."""
        if urgent:
            self._urgent.set()
        self._wake.set()

    @property
    def woken(self) -> bool:
        return self._wake.is_set()

    def stop(self, deadline: float) -> bool:
        """Ask the thread to send what remains and exit; wait until ``deadline``.

        ``deadline`` is a ``time.monotonic()`` value. Returns True iff the thread ended.
        """
        self._deadline = deadline
        self._stopping = True
        self.wake(urgent=True)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._transport = self._make_transport()
            self.endpoint = self._transport.endpoint
            errors = 0
            while not self._stopping:
                self._wake.wait(self._interval)
                self._wake.clear()
                try:
                    self._drain()
                    errors = 0
                except Exception:  # a bug: say it, wait, go on (a month-long run)
                    errors += 1
                    _bug(self._warned, "sender", "the sender thread failed to send a "
                         "batch; it tries again (the frames stay in memory and the spool)")
                    self._urgent.clear()  # else a flush's leftover makes it a busy loop
                    self._urgent.wait(min(self._max_backoff, 2.0 ** min(errors, 16)))
            self._drain()
        except Exception:  # a bug here must never reach the training job
            log.exception("logitwatch: the sender thread failed; frames are no longer sent "
                          "(they stay in memory and the spool; see `logitwatch push`)")
        finally:
            if self._transport is not None:
                try:
                    self._transport.close()
                except Exception:
                    log.debug("closing the HTTP client failed", exc_info=True)

    def _drain(self) -> None:
        """Send batches until nothing waits, or until giving up (failure while stopping)."""
        assert self._transport is not None
        attempt = 0
        while True:
            if self._stopping and time.monotonic() >= self._deadline:
                return
            batch = self._backlog.take(self._max_batch)
            if batch is None:
                return
            self._urgent.clear()
            timeout = self._deadline - time.monotonic() if self._stopping else None
            outcome = self._transport.post(batch.lines, timeout=timeout)
            if outcome.kind == "ok":
                self._failing = (-1, 0)
                dup = outcome.answer.get("duplicates")
                self._backlog.settle(batch, "delivered",
                                     duplicates=dup if isinstance(dup, int) else 0)
                if attempt:
                    log.info("logitwatch: the collector at %s is reachable again; sending "
                             "what was kept", self._transport.endpoint)
                    self._warned.discard("retry")
                attempt = 0
                self._answer(outcome)
                continue
            if outcome.kind == "reject" or self._repeats(batch, outcome):
                if self._isolate(batch, outcome):
                    attempt = 0
                    continue
            self._backlog.count("retries")
            self._backlog.settle(batch, "failed")
            self._on_down()
            delay = backoff_delay(
                attempt, max_backoff=self._max_backoff, retry_after=outcome.retry_after
            )
            if self._stopping:  # shutdown: keep trying, more often, until its deadline
                left = self._deadline - time.monotonic()
                if left <= 0:
                    return
                delay = min(delay, SHUTDOWN_BACKOFF, left)
            attempt += 1
            hint = failure_hint(outcome)
            self._warn_once(
                "retry",
                "logitwatch: cannot deliver to %s (%s)%s; frames are kept (disk spool) and "
                "retried with backoff; training is not affected (shown once per outage)",
                self._transport.endpoint,
                outcome.message,
                f": {hint}" if hint else "",
            )
            self._urgent.wait(delay)

    def _repeats(self, batch: Batch, outcome: Outcome) -> bool:
        """Whether the collector answered 500 (or 409) to the batch starting at ``batch.first``
        :data:`POISON_AFTER` times in a row (3, 6, ...): time to look for a frame it fails
        on (e.g. a value its database cannot hold) instead of retrying for ever."""
        if not outcome.server_error:
            self._failing = (-1, 0)
            return False
        first, n = self._failing
        n = n + 1 if first == batch.first else 1
        self._failing = (batch.first, n)
        return n % POISON_AFTER == 0

    def _isolate(self, batch: Batch, outcome: Outcome) -> bool:
        """Send ``batch`` in halves, and halves of the halves that fail, so that one frame
        the collector refuses (4xx) or fails on (500) cannot take the others with it.

        Frames refused one by one are set aside as rejected; frames failing alone with a
        500 are set aside as quarantined, but only if some frame of the batch went through
        (the collector works; those frames break it): with no 2xx at all it is an outage,
        and the batch is kept for a later retry (returns False, as on a connection error,
        429, 503, a timeout or the shutdown deadline). What was learnt is kept for that
        retry (frames stored, frames refused), so a batch interrupted again and again still
        gets through. Returns True once the batch is settled.
        """
        assert self._transport is not None
        if self._progress_first != batch.first:
            self._stored.clear()
            self._aside.clear()
            self._progress_first = batch.first
        todo = [line for line in batch.lines
                if _seq(line) not in self._stored and _seq(line) not in self._aside]
        first: Outcome | None = outcome if len(todo) == len(batch.lines) else None
        parts: deque[tuple[list[bytes], Outcome | None]] = deque([(todo, first)] if todo
                                                                 else [])
        budget = 2 * max(1, len(todo)).bit_length() + 3  # 500s before any frame went through
        reset = False
        while parts:
            part, out = parts.popleft()
            if out is None:
                if self._stopping and time.monotonic() >= self._deadline:
                    return False
                timeout = self._deadline - time.monotonic() if self._stopping else None
                out = self._transport.post(part, timeout=timeout)
            if out.kind == "ok":
                self._stored.update(_seq(line) for line in part)
                dup = out.answer.get("duplicates")
                self._duplicates += dup if isinstance(dup, int) else 0
                self._answer(out)
                continue
            if out.kind != "reject" and not out.server_error:
                if out.status == 0 and not reset:
                    # A server may close the connection after a 500 (uvicorn does for an
                    # exception): this request met the closed connection. Once more.
                    reset = True
                    parts.appendleft((part, None))
                    continue
                return False  # an outage, a rate limit: the usual retry with backoff
            if out.server_error and not self._stored:
                budget -= 1
                if budget <= 0:
                    return False  # nothing goes through: the collector is failing
            if len(part) > 1:
                mid = len(part) // 2
                parts.extendleft([(part[mid:], None), (part[:mid], None)])
                continue
            kind = "rejected" if out.kind == "reject" else "quarantined"
            self._aside[_seq(part[0])] = (kind, part[0], f"{out.status}:{out.code}",
                                          out.message)
        suspects = [v for v in self._aside.values() if v[0] == "quarantined"]
        if suspects and not self._stored:
            return False
        seqs = {_seq(line) for line in batch.lines}
        aside = [v for k, v in self._aside.items() if k in seqs]
        delivered = sum(1 for k in self._stored if k in seqs)
        rejected = [v[1] for v in aside if v[0] == "rejected"]
        quarantined = [v[1] for v in aside if v[0] == "quarantined"]
        paths = self._backlog.keep_aside(rejected, quarantined)
        causes: dict[str, tuple[str, str, int]] = {}
        for kind, _, cause, message in aside:
            causes[cause] = (kind, message, causes.get(cause, ("", "", 0))[2] + 1)
        where = f"; set aside in {', '.join(paths)}" if paths else ""
        for cause, (kind, message, n) in causes.items():
            self._warn_once(
                "aside:" + cause,
                "logitwatch: the collector %s %d of %d frame(s) of a batch (%s); the other "
                "%d were delivered%s. Further frames %s for this cause are logged at debug "
                "level (stats[%r])",
                "refused" if kind == "rejected" else "keeps failing (500) on",
                n, len(batch.lines), message, delivered, where, kind, kind)
        self._backlog.settle_parts(batch, delivered=delivered, duplicates=self._duplicates,
                                   rejected=rejected, quarantined=quarantined)
        self._stored.clear()
        self._aside.clear()
        self._duplicates = 0
        self._progress_first = -1
        return True

    def _answer(self, outcome: Outcome) -> None:
        try:
            self._on_answer(outcome.answer)
        except Exception:
            log.exception("logitwatch: handling the ingest answer failed")

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        warn_once(self._warned, key, msg, *args)


class Spooler:
    """Owns the daemon thread that writes frames from memory to the disk spool."""

    def __init__(self, backlog: Backlog, *, interval: float) -> None:
        self._backlog = backlog
        self._interval = interval
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="logitwatch-spooler",
                                        daemon=True)
        self.high_frames = max(1, backlog.max_frames // 2)
        self.high_bytes = max(1, backlog.max_bytes // 2)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        if not self._wake.is_set():
            self._wake.set()

    def stop(self, timeout: float) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))

    def _run(self) -> None:
        backlog = self._backlog
        mark = backlog.last_seq  # the newest frame at the previous tick
        warned: set[str] = set()
        try:
            while not self._stopping:
                self._wake.wait(self._interval / 2)
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    self._tick(mark)
                except Exception:  # a bug: say it, go on at the next tick
                    _bug(warned, "spooler", "the spooler thread failed to write frames to "
                         "disk; it tries again at its next tick")
                mark = backlog.last_seq
        except Exception:
            log.exception("logitwatch: the spooler thread failed; frames are no longer "
                          "written to disk")

    def _tick(self, mark: int) -> None:
        backlog = self._backlog
        if backlog.link_down:
            backlog.spill(0, 0)
        elif backlog.waiting() > self.high_frames or backlog.mem_bytes > self.high_bytes:
            backlog.spill(self.high_frames // 2, self.high_bytes // 2)
        # Frames that were already queued at the previous tick, half an interval ago, and
        # are still not delivered (a slow collector: the sender sits in one long request) go
        # to disk too, in flight or not: a crash of the job loses at most spool_interval
        # seconds of frames.
        backlog.spill(0, 0, through=mark)
        backlog.persist_inflight(mark)


def _bug(warned: set[str], key: str, message: str) -> None:
    """Log an unexpected error of a worker thread with its traceback, once per thread and
    kind of error (the thread goes on)."""
    kind = type(sys.exc_info()[1]).__name__
    warn_once(warned, f"bug:{key}:{kind}", "logitwatch: %s", message, exc_info=True)
