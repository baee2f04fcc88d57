"""Webhook notifications, sent from a background thread so ingest never waits on them.

The payload is JSON: ``{"kind": "logitwatch.alert", "text": ..., "alert": {...}}``. The
``text`` field makes it a valid Slack incoming-webhook message as is.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from typing import Any

import httpx

from logitwatch.server.schemas import AlertOut

__all__ = ["WebhookNotifier", "payload"]

log = logging.getLogger("logitwatch.notify")


def payload(alert: AlertOut) -> dict[str, Any]:
    where = f"rank {alert.rank}"
    if alert.layer is not None:
        where += f", layer {alert.layer}, head {alert.head}"
    verb = "FIRING" if alert.state == "firing" else alert.state.upper()
    text = f"[logitwatch] {verb} {alert.rule} in run {alert.run} ({where}): {alert.message}"
    return {"kind": "logitwatch.alert", "text": text, "alert": alert.model_dump(mode="json")}


class WebhookNotifier:
    """POSTs alerts to one URL with retries and exponential backoff; bounded queue."""

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 5,
                 max_queue: int = 1000) -> None:
        self.url = url
        self.retries = retries
        self._q: queue.Queue[AlertOut | None] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._http = httpx.Client(timeout=timeout)
        self.sent = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="logitwatch-webhook", daemon=True)
        self._thread.start()

    def notify(self, alert: AlertOut) -> None:
        try:
            self._q.put_nowait(alert)
        except queue.Full:
            self.failed += 1
            log.error("webhook queue full; alert %s not sent", alert.id)

    def _run(self) -> None:
        while True:
            alert = self._q.get()
            if alert is None:
                return
            self._deliver(alert)
            self._q.task_done()

    def _deliver(self, alert: AlertOut) -> None:
        body = payload(alert)
        for attempt in range(self.retries + 1):
            try:
                r = self._http.post(self.url, json=body)
                if r.status_code < 300:
                    self.sent += 1
                    return
                if r.status_code < 500 and r.status_code != 429:
                    break
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                why = repr(e)
            delay = min(30.0, 0.5 * 2**attempt) * random.uniform(0.8, 1.2)
            if self._stop.wait(delay):
                break
            log.warning("webhook attempt %d failed (%s); retrying", attempt + 1, why)
        self.failed += 1
        log.error("webhook delivery of alert %s to %s failed", alert.id, self.url)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._http.close()
