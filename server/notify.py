"""Webhook notifications, sent from a background thread so ingest never waits on them.

The payload is JSON: ``{"kind": "logitwatch.alert", "text": ..., "alert": {...}}``. The
``text`` field makes it a valid Slack incoming-webhook message as is.

With a database (``sessions=``), every notification is first written to the
``alert_outbox`` table and deleted once delivered: retries with exponential backoff
(capped at 30 s) survive a collector restart (the next collector on the same database
delivers what is left), and a receiver that is down is retried until the notification is
``give_up_after`` old (an hour), not for a fixed number of attempts (five took 15 s: a
receiver restarting for a minute lost every alert meanwhile). Several collectors on one
database share the outbox: each claims a row (a conditional UPDATE of its ``next_at``)
before it posts, so one of them sends it. Notifications of one alert go out in the order
they were queued (its resolve never before its fire); other alerts are not held up by a
notification being retried. Each POST carries an ``Idempotency-Key`` header (the outbox
row's id), the same on every retry: delivery is at least once (a POST that timed out but
was processed is sent again), and a receiver can drop the repeats. Without a database,
notifications wait in a bounded in-memory queue, with ``retries`` retries each. The outbox
is bounded too (``max_queue`` per URL): past it the oldest notification is dropped, logged.

A receiver that throttles (HTTP 429, or 503 with ``Retry-After``: Slack takes about one
message a second) is waited for, as long as ``Retry-After`` says (capped at 10 minutes), and
nothing else is sent to it meanwhile; such answers are not failures and do not count toward
``retries``. A throttled notification is given up only once it is ``give_up_after`` old
(an hour by default), logged with the number of attempts.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from typing import Any

import httpx
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.db.models import OutboxItem
from logitwatch.server.schemas import AlertOut
from logitwatch.wire import parse_retry_after

__all__ = ["WebhookNotifier", "backoff", "payload", "retry_after", "verdict"]

log = logging.getLogger("logitwatch.notify")

#: The longest wait a ``Retry-After`` can impose on one attempt.
MAX_RETRY_AFTER = 600.0


def verdict(alert: AlertOut) -> str | None:
    """What changed, said before the alert's message, when the message alone would bury it:
    an alert that fired as ``info`` and paged later (the step and why: the message tells
    the firing first and the escalation last), or one that resolved (the step, and whether
    it paged or recovered without paging). None for an alert that fired as it is."""
    ev = alert.evidence or {}
    if alert.state == "firing":
        if alert.paged_step is None or alert.paged_step == alert.fired_step:
            return None
        why = ev.get("escalated_because")
        return (f"paged at step {alert.paged_step} (fired as info at step "
                f"{alert.fired_step})" + (f": {why}" if why else ""))
    if alert.resolved_step is None:
        return None
    out = f"resolved at step {alert.resolved_step}"
    if ev.get("recovered"):
        return out + ", recovered without paging"
    if alert.paged_step is not None:
        out += f" (it paged at step {alert.paged_step})"
    return out


def payload(alert: AlertOut) -> dict[str, Any]:
    """The JSON body for one alert (Slack-compatible through its ``text``): a first line
    that says what changed (:func:`verdict`), then the alert's message."""
    where = f"rank {alert.rank}"
    if alert.layer is not None:
        heads = alert.heads or ([alert.head] if alert.head is not None else [])
        where += f", layer {alert.layer}, head{'s' if len(heads) > 1 else ''} " + \
            ", ".join(str(h) for h in heads)
    verb = "FIRING" if alert.state == "firing" else alert.state.upper()
    text = f"[logitwatch] {verb} {alert.severity} {alert.rule} in run {alert.run} ({where})"
    said = verdict(alert)
    text += f": {said}.\n{alert.message}" if said else f": {alert.message}"
    if alert.state == "firing" and alert.remedies:
        text += "\nWhat to do: " + " | ".join(alert.remedies[:3])
    return {"kind": "logitwatch.alert", "text": text, "alert": alert.model_dump(mode="json")}


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential with +-20 % jitter."""
    return min(cap, base * 2**attempt) * random.uniform(0.8, 1.2)


def retry_after(value: str | None, now: float | None = None,
                cap: float = MAX_RETRY_AFTER) -> float | None:
    """Seconds a receiver's ``Retry-After`` asks to wait, at most ``cap``; None when
    absent or unreadable."""
    seconds = parse_retry_after(value, now)
    return None if seconds is None else min(cap, seconds)


class _Outcome:
    """One attempt's outcome: ``why`` is None on success; ``fatal`` gives up at once;
    ``wait`` (seconds, throttled) retries after it without counting an attempt."""

    __slots__ = ("fatal", "wait", "why")

    def __init__(self, why: str | None, *, fatal: bool = False,
                 wait: float | None = None) -> None:
        self.why, self.fatal, self.wait = why, fatal, wait


class WebhookNotifier:
    """POSTs alerts to one URL with retries and exponential backoff.

    Args:
        url: The webhook URL.
        timeout: Seconds per HTTP request.
        retries: Without a database: retries after failed attempts (errors, 5xx) before a
            notification is given up; throttled answers (429, 503 with ``Retry-After``)
            do not count. The outbox retries until ``give_up_after`` instead.
        max_queue: Bound of the queue: in memory, or of the outbox for this URL (the oldest
            is dropped past it).
        sessions: A session factory: use the persistent outbox.
        base_delay: First retry delay in seconds (doubles each retry, capped at 30 s).
        give_up_after: Seconds after which a notification still throttled (in the outbox:
            still failing) is given up.
        info: Also send the alerts that never paged (``paged_step`` None: info, shown on
            the dashboard); by default only an alert that pages is sent, when it fires or
            escalates to a paging severity and when it resolves.
    """

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 5,
                 max_queue: int = 1000, sessions: sessionmaker[Session] | None = None,
                 base_delay: float = 0.5, give_up_after: float = 3600.0,
                 info: bool = False) -> None:
        self.url = url
        self.info = info
        self.skipped = 0  # alerts that never paged, not sent (``info`` False)
        self.retries = retries
        self.base_delay = base_delay
        self.max_queue = max_queue
        self.give_up_after = give_up_after
        self._hold_until = 0.0  # the receiver throttles: nothing is sent to it before this
        self._sessions = sessions
        self._q: queue.Queue[AlertOut | None] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._http = httpx.Client(timeout=timeout)
        self.sent = 0
        self.failed = 0
        target = self._run_outbox if sessions is not None else self._run
        self._thread = threading.Thread(target=target, name="logitwatch-webhook", daemon=True)
        self._thread.start()

    def notify(self, alert: AlertOut) -> None:
        """Queue ``alert`` for delivery (unless it never paged and ``info`` is off); never
        raises."""
        if not self.info and alert.paged_step is None:
            self.skipped += 1  # info: the dashboard shows it; a page is for what pages
            return
        if self._sessions is not None:
            try:
                with self._sessions.begin() as s:
                    now = time.time()
                    s.add(OutboxItem(url=self.url, body=payload(alert), attempts=0,
                                     next_at=now, created_at=now))
                    self._bound_outbox(s)
                self._wake.set()
            except Exception:
                self.failed += 1
                log.exception("could not queue the webhook for alert %s", alert.id)
            return
        try:
            self._q.put_nowait(alert)
        except queue.Full:
            self.failed += 1
            log.error("webhook queue full; alert %s not sent", alert.id)

    def pending(self) -> int:
        """Notifications not yet delivered nor given up."""
        if self._sessions is None:
            return self._q.qsize()
        with self._sessions() as s:
            return len(s.scalars(select(OutboxItem.id).where(OutboxItem.url == self.url)).all())

    # -- in-memory mode ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            alert = self._q.get()
            if alert is None:
                return
            self._deliver(payload(alert), alert.id)
            self._q.task_done()

    def _post(self, body: dict[str, Any], key: str | None = None) -> _Outcome:
        """One attempt, once any ``Retry-After`` of the receiver has passed; ``key``: the
        ``Idempotency-Key`` (the same on every attempt at one notification)."""
        try:
            r = self._http.post(self.url, json=body,
                                headers={"Idempotency-Key": key} if key else None)
        except httpx.HTTPError as e:
            return _Outcome(repr(e))
        if r.status_code < 300:
            return _Outcome(None)
        why = f"HTTP {r.status_code}"
        after = retry_after(r.headers.get("retry-after"))
        if r.status_code == 429 or (r.status_code == 503 and after is not None):
            wait = after if after is not None else backoff(3, self.base_delay)
            self._hold_until = time.time() + wait
            return _Outcome(f"{why} (throttled, retry after {wait:.3g} s)", wait=wait)
        if r.status_code < 500:
            return _Outcome(f"fatal: {why}", fatal=True)
        return _Outcome(why)

    def _next_delay(self, out: _Outcome, failures: int, created: float,
                    by_age: bool = False) -> float | None:
        """Seconds before the next attempt at a notification queued at ``created`` whose
        attempt answered ``out``, after ``failures`` failed attempts (throttled answers do
        not count); None to give it up: a fatal answer, retries spent (``by_age``, the
        outbox: once ``give_up_after`` old instead), or throttled past ``give_up_after``.
        The one retry policy of both modes."""
        if out.fatal or (failures > self.retries and not by_age):
            return None
        delay = out.wait if out.wait is not None else backoff(failures - 1, self.base_delay)
        if (out.wait is not None or by_age) and \
                time.time() + delay - created > self.give_up_after:
            return None
        return delay

    def _deliver(self, body: dict[str, Any], alert_id: object) -> None:
        created, attempt, failures = time.time(), 0, 0
        key = f"logitwatch-{uuid.uuid4().hex}"
        while True:
            attempt += 1
            out = self._post(body, key=key)
            if out.why is None:
                self.sent += 1
                return
            failures += out.wait is None
            delay = self._next_delay(out, failures, created)
            if delay is None:
                break
            log.warning("webhook attempt %d failed (%s); retrying in %.3g s", attempt, out.why,
                        delay)
            if self._stop.wait(delay):
                break
        self.failed += 1
        log.error("webhook delivery of alert %s to %s failed after %d attempts (%s)",
                  alert_id, self.url, attempt, out.why)

    # -- outbox mode -----------------------------------------------------------------------

    def _bound_outbox(self, s: Session) -> None:
        """Drop the oldest items of this URL past ``max_queue`` (in the open transaction)."""
        over = s.scalars(select(OutboxItem.id).where(OutboxItem.url == self.url)
                         .order_by(OutboxItem.id.desc()).offset(self.max_queue)).all()
        if over:
            s.execute(delete(OutboxItem).where(OutboxItem.id.in_(over)))
            self.failed += len(over)
            log.error("webhook outbox for %s full (%d); dropped the %d oldest notifications",
                      self.url, self.max_queue, len(over))

    def _run_outbox(self) -> None:
        assert self._sessions is not None
        while not self._stop.is_set():
            wait = 1.0
            try:
                wait = self._drain()
            except Exception:
                log.exception("webhook outbox pass failed")
            self._wake.wait(wait)
            self._wake.clear()

    def _drain(self) -> float:
        """Try the due items once, oldest first, until the receiver throttles; return
        seconds until the next one is due (max 1 s). An item waiting for a retry (or
        claimed by another collector) holds back the later items of its alert only."""
        assert self._sessions is not None
        now = time.time()
        if now < self._hold_until:
            return max(0.01, min(1.0, self._hold_until - now))
        with self._sessions() as s:
            head = s.scalars(select(OutboxItem).where(OutboxItem.url == self.url)
                             .order_by(OutboxItem.id).limit(200)).all()
            s.expunge_all()
        held: set[object] = set()  # alerts with an earlier notification still pending
        for item in head:
            if self._stop.is_set():
                break
            alert = (item.body.get("alert") or {}).get("id") if isinstance(item.body, dict) \
                else None
            if item.next_at > time.time() or (alert is not None and alert in held):
                held.add(alert)
                continue
            if not self._claim(item):
                held.add(alert)  # another collector is sending it
                continue
            out = self._post(item.body, key=f"logitwatch-outbox-{item.id}")
            with self._sessions.begin() as s:
                if out.why is None:
                    self.sent += 1
                    s.execute(delete(OutboxItem).where(OutboxItem.id == item.id))
                    continue
                held.add(alert)
                attempts = item.attempts + (out.wait is None)
                delay = self._next_delay(out, attempts, item.created_at, by_age=True)
                if delay is None:
                    self.failed += 1
                    log.error("webhook delivery to %s failed for good after %d failed "
                              "attempts, %.0f s queued (%s)", self.url, attempts,
                              time.time() - item.created_at, out.why)
                    s.execute(delete(OutboxItem).where(OutboxItem.id == item.id))
                else:
                    s.execute(update(OutboxItem).where(OutboxItem.id == item.id).values(
                        attempts=attempts, next_at=time.time() + delay, last_error=out.why))
                    log.warning("webhook attempt %d failed (%s); retrying in %.3g s",
                                attempts, out.why, delay)
            if out.wait is not None:
                break  # throttled: nothing more to this receiver before Retry-After
        with self._sessions() as s:
            nxt = s.scalar(select(OutboxItem.next_at).where(OutboxItem.url == self.url)
                           .order_by(OutboxItem.next_at).limit(1))
        nxt = None if nxt is None else max(nxt, self._hold_until)
        return 1.0 if nxt is None else max(0.01, min(1.0, nxt - time.time()))

    def _claim(self, item: OutboxItem) -> bool:
        """Take ``item`` for one attempt: move its ``next_at`` past the attempt's longest
        time, if no other collector moved it first (its ``next_at`` is still the one read)."""
        assert self._sessions is not None
        lease = time.time() + 2 * float(self._http.timeout.read or 5.0) + 5.0
        with self._sessions.begin() as s:
            got = s.execute(update(OutboxItem).where(
                OutboxItem.id == item.id, OutboxItem.next_at == item.next_at)
                .values(next_at=lease).execution_options(synchronize_session=False))
            return bool(got.rowcount)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sender (undelivered outbox items stay for the next collector)."""
        self._stop.set()
        self._wake.set()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._http.close()
