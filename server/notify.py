"""Webhook notifications, sent from a background thread so ingest never waits on them.

The payload is JSON: ``{"kind": "logitwatch.alert", "text": ..., "alert": {...}}``. The
``text`` field makes it a valid Slack incoming-webhook message as is.

With a database (``sessions=``), every notification is first written to the
``alert_outbox`` table and deleted once delivered: retries with exponential backoff
survive a collector restart (the next collector on the same database delivers what is left).
Without one, notifications wait in a bounded in-memory queue.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from typing import Any

import httpx
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.db.models import OutboxItem
from logitwatch.server.schemas import AlertOut

__all__ = ["WebhookNotifier", "backoff", "payload"]

log = logging.getLogger("logitwatch.notify")


def payload(alert: AlertOut) -> dict[str, Any]:
    """The JSON body for one alert (Slack-compatible through its ``text``)."""
    where = f"rank {alert.rank}"
    if alert.layer is not None:
        heads = alert.heads or ([alert.head] if alert.head is not None else [])
        where += f", layer {alert.layer}, head{'s' if len(heads) > 1 else ''} " + \
            ", ".join(str(h) for h in heads)
    verb = "FIRING" if alert.state == "firing" else alert.state.upper()
    text = (f"[logitwatch] {verb} {alert.severity} {alert.rule} in run {alert.run} "
            f"({where}): {alert.message}")
    if alert.state == "firing" and alert.remedies:
        text += "\nWhat to do: " + " | ".join(alert.remedies[:3])
    return {"kind": "logitwatch.alert", "text": text, "alert": alert.model_dump(mode="json")}


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0) -> float:
    """Seconds before retry ``attempt`` (0-based): exponential with +-20 % jitter."""
    return min(cap, base * 2**attempt) * random.uniform(0.8, 1.2)


class WebhookNotifier:
    """POSTs alerts to one URL with retries and exponential backoff.

    Args:
        url: The webhook URL.
        timeout: Seconds per HTTP request.
        retries: Retries after the first attempt before a notification is given up.
        max_queue: Bound of the in-memory queue (without ``sessions``).
        sessions: A session factory: use the persistent outbox.
        base_delay: First retry delay in seconds (doubles each retry, capped at 30 s).
    """

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 5,
                 max_queue: int = 1000, sessions: sessionmaker[Session] | None = None,
                 base_delay: float = 0.5) -> None:
        self.url = url
        self.retries = retries
        self.base_delay = base_delay
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
        """Queue ``alert`` for delivery; never raises."""
        if self._sessions is not None:
            try:
                with self._sessions.begin() as s:
                    now = time.time()
                    s.add(OutboxItem(url=self.url, body=payload(alert), attempts=0,
                                     next_at=now, created_at=now))
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

    def _post(self, body: dict[str, Any]) -> str | None:
        """One attempt: None on success, "fatal: ..." for a 4xx, else the reason to retry."""
        try:
            r = self._http.post(self.url, json=body)
        except httpx.HTTPError as e:
            return repr(e)
        if r.status_code < 300:
            return None
        if r.status_code < 500 and r.status_code != 429:
            return f"fatal: HTTP {r.status_code}"
        return f"HTTP {r.status_code}"

    def _deliver(self, body: dict[str, Any], alert_id: object) -> None:
        for attempt in range(self.retries + 1):
            why = self._post(body)
            if why is None:
                self.sent += 1
                return
            if why.startswith("fatal") or self._stop.wait(backoff(attempt, self.base_delay)):
                break
            log.warning("webhook attempt %d failed (%s); retrying", attempt + 1, why)
        self.failed += 1
        log.error("webhook delivery of alert %s to %s failed", alert_id, self.url)

    # -- outbox mode -----------------------------------------------------------------------

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
        """Try every due item once; return seconds until the next one is due (max 1 s)."""
        assert self._sessions is not None
        now = time.time()
        with self._sessions() as s:
            due = s.scalars(select(OutboxItem).where(OutboxItem.url == self.url,
                                                     OutboxItem.next_at <= now)
                            .order_by(OutboxItem.id).limit(50)).all()
            s.expunge_all()
        for item in due:
            if self._stop.is_set():
                break
            why = self._post(item.body)
            with self._sessions.begin() as s:
                if why is None:
                    self.sent += 1
                    s.execute(delete(OutboxItem).where(OutboxItem.id == item.id))
                elif why.startswith("fatal") or item.attempts >= self.retries:
                    self.failed += 1
                    log.error("webhook delivery to %s failed for good (%s)", self.url, why)
                    s.execute(delete(OutboxItem).where(OutboxItem.id == item.id))
                else:
                    row = s.get(OutboxItem, item.id)
                    if row is not None:
                        row.attempts = item.attempts + 1
                        row.next_at = time.time() + backoff(item.attempts, self.base_delay)
                        row.last_error = why
                    log.warning("webhook attempt %d failed (%s); retrying",
                                item.attempts + 1, why)
        with self._sessions() as s:
            nxt = s.scalar(select(OutboxItem.next_at).where(OutboxItem.url == self.url)
                           .order_by(OutboxItem.next_at).limit(1))
        return 1.0 if nxt is None else max(0.01, min(1.0, nxt - time.time()))

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
