"""The background sender thread: batching, retries with backoff, bounded shutdown.

Loop: wait ``interval`` (or until woken because a batch is full or a flush was asked
for), then send everything waiting in batches of ``max_batch``. A batch that fails with a
connection error, 429 or 5xx stays in flight and is retried after
``backoff_delay(attempt)``; that wait is cut short by ``flush()`` and ``shutdown()`` but
not by new frames, so a down collector is not hammered. After shutdown each remaining
batch gets one last attempt, within the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ._http import IngestTransport, Outcome, backoff_delay
from ._queue import FrameQueue

__all__ = ["Sender"]

log = logging.getLogger("logitwatch.client")


class Sender:
    """Owns the daemon thread that moves frames from a :class:`FrameQueue` to the collector."""

    def __init__(
        self,
        queue: FrameQueue,
        transport: IngestTransport,
        *,
        max_batch: int,
        interval: float,
        max_backoff: float,
        on_answer: Callable[[dict[str, Any]], None],
    ) -> None:
        self._queue = queue
        self._transport = transport
        self._max_batch = max_batch
        self._interval = interval
        self._max_backoff = max_backoff
        self._on_answer = on_answer
        self._wake = threading.Event()  # a batch is full, a flush or shutdown
        self._urgent = threading.Event()  # cut a backoff wait short (flush, shutdown)
        self._stopping = False
        self._deadline = float("inf")
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="logitwatch-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, *, urgent: bool = False) -> None:
        """Send now instead of at the next tick; ``urgent`` also ends a backoff wait."""
        if urgent:
            self._urgent.set()
        self._wake.set()

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
            while not self._stopping:
                self._wake.wait(self._interval)
                self._wake.clear()
                self._drain()
            self._drain()
        except Exception:  # a bug here must never reach the training job
            log.exception("logitwatch: the sender thread failed; frames are no longer sent")
        finally:
            try:
                self._transport.close()
            except Exception:
                log.debug("closing the HTTP client failed", exc_info=True)

    def _drain(self) -> None:
        """Send batches until the queue is empty, or until giving up at shutdown."""
        while True:
            if self._stopping and time.monotonic() >= self._deadline:
                return
            batch = self._queue.take(self._max_batch)
            if not batch or not self._deliver(batch):
                return

    def _deliver(self, batch: list[dict[str, Any]]) -> bool:
        """Deliver or reject one batch, retrying as needed. False: gave up (shutdown)."""
        attempt = 0
        while True:
            self._urgent.clear()
            outcome = self._transport.post(batch)
            if outcome.kind == "ok":
                self._queue.done(delivered=True)
                self._answer(outcome)
                return True
            if outcome.kind == "reject":
                self._warn_once(
                    "reject:" + outcome.message,
                    "logitwatch: the collector rejected a batch of %d frames, dropped: %s",
                    len(batch),
                    outcome.message,
                )
                self._queue.done(delivered=False)
                return True
            self._queue.count("retries")
            if self._stopping:
                return False
            delay = backoff_delay(
                attempt, max_backoff=self._max_backoff, retry_after=outcome.retry_after
            )
            attempt += 1
            self._warn_once(
                "retry",
                "logitwatch: cannot deliver to %s (%s); frames are kept and retried "
                "with backoff (this message is shown once)",
                self._transport.endpoint,
                outcome.message,
            )
            self._urgent.wait(delay)

    def _answer(self, outcome: Outcome) -> None:
        if outcome.message:
            self._warn_once("answer", "logitwatch: %s", outcome.message)
        try:
            self._on_answer(outcome.answer)
        except Exception:
            log.exception("logitwatch: handling the ingest answer failed")

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, msg, *args)
