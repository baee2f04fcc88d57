"""The two background threads of a client: the sender (network) and the spooler (disk).

Sender loop (the ``while not stop: wait(interval)`` idiom): wait ``interval``, or until
woken because a batch is full or a flush was asked for, then send batches of up to
``max_batch`` frames, oldest first, until nothing waits. A batch that fails is handed to
the backlog (which spools it) and the next attempt waits ``backoff_delay(attempt)``; that
wait is cut short by ``flush()`` and ``shutdown()`` but not by new frames, so a down
collector is not hammered. While stopping, a failure ends the loop at once.

Spooler loop: keeps the disk spool fed so that the sender, which may sit for seconds in
one slow request, never makes the training thread wait or drop: when memory passes half
of its bounds it writes the oldest frames down to a quarter; while the collector is
unreachable it writes everything in memory every ``spool_interval``.

Neither thread ever lets an exception out: a bug is logged, and the client degrades
instead of breaking the training job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ._http import IngestTransport, Outcome, backoff_delay
from ._queue import Backlog

__all__ = ["Sender", "Spooler"]

log = logging.getLogger("logitwatch.client")


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
            while not self._stopping:
                self._wake.wait(self._interval)
                self._wake.clear()
                self._drain()
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
            if outcome.kind == "reject":
                self._warn_once(
                    "reject:" + outcome.message,
                    "logitwatch: the collector rejected a batch of %d frames as invalid, "
                    "dropped: %s",
                    len(batch.lines),
                    outcome.message,
                )
                self._backlog.settle(batch, "rejected")
                continue
            self._backlog.count("retries")
            self._backlog.settle(batch, "failed")
            self._on_down()
            if self._stopping:
                return
            delay = backoff_delay(
                attempt, max_backoff=self._max_backoff, retry_after=outcome.retry_after
            )
            attempt += 1
            self._warn_once(
                "retry",
                "logitwatch: cannot deliver to %s (%s); frames are kept (disk spool) and "
                "retried with backoff; training is not affected (shown once per outage)",
                self._transport.endpoint,
                outcome.message,
            )
            self._urgent.wait(delay)

    def _answer(self, outcome: Outcome) -> None:
        try:
            self._on_answer(outcome.answer)
        except Exception:
            log.exception("logitwatch: handling the ingest answer failed")

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, msg, *args)


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
        try:
            while not self._stopping:
                self._wake.wait(self._interval)
                self._wake.clear()
                if self._stopping:
                    return
                if backlog.link_down:
                    backlog.spill(0, 0)
                elif (backlog.waiting() > self.high_frames
                      or backlog.mem_bytes > self.high_bytes):
                    backlog.spill(self.high_frames // 2, self.high_bytes // 2)
        except Exception:
            log.exception("logitwatch: the spooler thread failed; frames are no longer "
                          "written to disk")
