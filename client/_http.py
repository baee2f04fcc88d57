"""One ingest request and the classification of its answer; the retry schedule.

:class:`IngestTransport` turns ``POST {url}/api/v1/ingest`` into an :class:`Outcome`:

* ``"ok"``: a 2xx answer; the frames are delivered (``answer`` holds the decoded body,
  ``{}`` if it was not a JSON object).
* ``"retry"``: a connection error or timeout, 429, or any 5xx; keep the batch.
* ``"reject"``: any other status (4xx but 429, unexpected 3xx); the collector refused
  the batch and sending it again would not help.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

__all__ = ["INGEST_PATH", "IngestTransport", "Outcome", "backoff_delay", "parse_retry_after"]

INGEST_PATH = "/api/v1/ingest"


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt to deliver a batch."""

    kind: Literal["ok", "retry", "reject"]
    answer: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    message: str = ""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def backoff_delay(
    attempt: int,
    *,
    max_backoff: float,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    ``2**attempt`` with ±20 % jitter, capped at ``max_backoff``. A server's
    ``Retry-After`` wins (without jitter), also capped at ``max_backoff`` so that a wrong
    header cannot stall delivery for hours; the batch is kept either way.
    """
    if retry_after is not None:
        return min(retry_after, max_backoff)
    base = 2.0 ** min(attempt, 62)
    jitter = (rng or random).uniform(0.8, 1.2)
    return min(base * jitter, max_backoff)


class IngestTransport:
    """Posts batches to one collector over an ``httpx.Client``.

    The transport owns the ``httpx.Client`` only if it created it; an injected one
    (tests, custom TLS or auth) is left open on :meth:`close`.
    """

    def __init__(self, url: str, *, timeout: float, http: httpx.Client | None = None,
                 token: str | None = None) -> None:
        self.endpoint = url.rstrip("/") + INGEST_PATH
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owned = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self._timeout = timeout

    def post(self, frames: list[dict[str, Any]]) -> Outcome:
        """Send one batch; never raises for network or HTTP failures."""
        try:
            resp = self._http.post(
                self.endpoint, json={"frames": frames}, headers=self._headers,
                timeout=self._timeout,
            )
        except httpx.TransportError as exc:
            return Outcome("retry", message=f"{type(exc).__name__}: {exc}")
        status = resp.status_code
        if 200 <= status < 300:
            try:
                body = resp.json()
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return Outcome("ok", message="the ingest answer was not a JSON object")
            return Outcome("ok", answer=body)
        message = _server_message(resp)
        if status == 429 or status >= 500:
            after = parse_retry_after(resp.headers.get("Retry-After"))
            return Outcome("retry", retry_after=after, message=message)
        return Outcome("reject", message=message)

    def close(self) -> None:
        if self._owned:
            self._http.close()


def _server_message(resp: httpx.Response) -> str:
    """``HTTP 422: <message>`` from the collector's ``{"code", "message"}`` error body."""
    text = ""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        parts = [str(body[k]) for k in ("code", "message") if body.get(k)]
        text = ": ".join(parts)
    if not text:
        text = resp.text[:500]
    return f"HTTP {resp.status_code}" + (f": {text}" if text else "")
