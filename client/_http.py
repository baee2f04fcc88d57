"""One ingest request and the classification of its answer; the retry schedule.

:class:`IngestTransport` turns ``POST {url}/api/v1/ingest`` into an :class:`Outcome`:

* ``"ok"``: a 2xx answer that is a JSON object; the frames are stored.
* ``"retry"``: the frames are kept (in the spool) and sent again later: a connection
  error or timeout, 408, 409, 425, 429, any 5xx, a 2xx whose body is not a JSON object
  (a proxy or another service answered, not the collector), and 401, 403, 404 and 421 (a
  token, URL or allowed host name to fix: the frames wait for it instead of being thrown
  away).
* ``"reject"``: any other 4xx (400, 413, 422, ...): the collector refused the batch as
  invalid, and sending it again would not help. The sender then sends it in halves to
  find the frames at fault (``_worker.Sender._isolate``), as it does when a batch is
  answered 500 (or 409) three times in a row.

The body is built from frames already encoded as JSON lines (``_codec.encode``), and
compressed with gzip from 1 KiB on when ``gzip_level`` > 0.
"""

from __future__ import annotations

# What the sender thread would otherwise import on its first request, imported here, on
# the thread that imports the client: httpx imports httpcore (and certifi, h11) only when
# its first Client is built, and the socket module imports the "idna" codec on the first
# connection to a host name. A process forked while another thread is inside an import
# leaves the child with that module's import lock held by a thread it does not have: the
# child's own sender then blocks for ever on its first import (a DataLoader worker forked
# while the parent's sender was starting).
import encodings.idna  # noqa: F401
import gzip
import random
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import certifi  # noqa: F401
import httpcore  # noqa: F401
import httpx

from logitwatch.wire import parse_retry_after

__all__ = [
    "INGEST_PATH", "KEEP_4XX", "IngestTransport", "Outcome", "backoff_delay", "failure_hint",
    "parse_retry_after",
]

INGEST_PATH = "/api/v1/ingest"


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt to deliver a batch."""

    kind: Literal["ok", "retry", "reject"]
    answer: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    message: str = ""
    status: int = 0  # the HTTP status; 0 when no answer came (connection error, timeout)
    code: str = ""  # the collector's error code ("invalid-request", "shape-mismatch", ...)

    @property
    def server_error(self) -> bool:
        """A 500 or a 409: the collector failed on this request (a bug, a value its
        database cannot hold, a conflict with stored data), not an outage (502, 503, 504,
        no answer). Retried; when it repeats, the sender looks for the frame at fault."""
        return self.status in (409, 500)


def failure_hint(outcome: Outcome) -> str:
    """What a person should check after ``outcome`` (a failed attempt), or "" when waiting
    is the cure (no answer yet, a busy or failing collector)."""
    status = outcome.status
    if 200 <= status < 300 or status == 404:
        return ("something answers at that address, but not a logitwatch collector's ingest "
                "path: pass the collector's base URL, e.g. http://127.0.0.1:8000 (the port "
                "`logitwatch serve` printed, without /api/v1)")
    if status in (401, 403):
        return ("the collector wants an ingest token of the run's project "
                "(`logitwatch token create --scope ingest`, LOGITWATCH_TOKEN)")
    if status == 421:
        return ("the collector does not answer to that host name: use its own name, or add "
                "this one to the collector's LOGITWATCH_ALLOWED_HOSTS")
    return ""


#: The shortest wait a server's ``Retry-After`` can ask for (seconds).
MIN_RETRY_AFTER = 1.0


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
    header cannot stall delivery for hours, and at least :data:`MIN_RETRY_AFTER` so that
    ``Retry-After: 0`` (or a date already past) cannot turn the retries into a busy loop
    beside the training thread; the batch is kept either way.
    """
    if retry_after is not None:
        return min(max(retry_after, MIN_RETRY_AFTER), max_backoff)
    base = 2.0 ** min(attempt, 62)
    jitter = (rng or random).uniform(0.8, 1.2)
    return min(base * jitter, max_backoff)


#: 4xx statuses after which the frames are kept and sent again (see the module docstring).
KEEP_4XX = frozenset({401, 403, 404, 408, 409, 421, 425, 429})
_GZIP_MIN = 1024


_SSL: ssl.SSLContext | None = None
_SSL_LOCK = threading.Lock()


def shared_ssl_context() -> ssl.SSLContext:
    """The process's TLS context for collectors (httpx's default: certifi's CAs, and
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set), made once and inherited by forked children.

    Why shared: a child forked while another thread of the parent is inside OpenSSL
    inherits OpenSSL's locks held, and creating a context there can hang for ever. Measured
    here: a child building an ``httpx.Client`` hung in ``ssl.SSLContext()`` in 2-4 of
    150-200 forks of a process whose other threads were making httpx clients. A DataLoader
    worker is such a child. The client's before-fork hook (``_process._before_fork``) makes
    sure the context exists before any fork of a process with a live client, so a child
    never creates one.
    """
    global _SSL
    ctx = _SSL
    if ctx is None:
        with _SSL_LOCK:
            if _SSL is None:
                _SSL = httpx.create_ssl_context()
            ctx = _SSL
    return ctx


class IngestTransport:
    """Posts batches to one collector over an ``httpx.Client``.

    The transport owns the ``httpx.Client`` only if it created it; an injected one
    (tests, custom TLS or auth) is left open on :meth:`close`.
    """

    def __init__(self, url: str, *, timeout: float, http: httpx.Client | None = None,
                 token: str | None = None, gzip_level: int = 1,
                 user_agent: str = "logitwatch-client") -> None:
        self.endpoint = url.rstrip("/") + INGEST_PATH
        self._headers = {"Content-Type": "application/json", "User-Agent": user_agent}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._owned = http is None
        self._http = http if http is not None else httpx.Client(
            timeout=timeout, verify=shared_ssl_context())
        self._timeout = timeout
        self._gzip_level = gzip_level

    def post(self, lines: list[bytes], timeout: float | None = None) -> Outcome:
        """Send one batch of encoded frames; never raises for network or HTTP failures."""
        body = b'{"frames":[' + b",".join(lines) + b"]}"
        headers = self._headers
        if self._gzip_level and len(body) >= _GZIP_MIN:
            body = gzip.compress(body, compresslevel=self._gzip_level, mtime=0)
            headers = {**headers, "Content-Encoding": "gzip"}
        try:
            resp = self._http.post(
                self.endpoint, content=body, headers=headers,
                timeout=self._timeout if timeout is None else max(0.1, timeout),
            )
        except httpx.TransportError as exc:
            return Outcome("retry", message=f"{type(exc).__name__}: {exc}")
        status = resp.status_code
        if 200 <= status < 300:
            try:
                answer = resp.json()
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                return Outcome("retry", message=f"HTTP {status} with a body that is not a "
                               "logitwatch ingest answer (is the URL a logitwatch collector?)",
                               status=status)
            return Outcome("ok", answer=answer)
        message, code = _server_message(resp)
        if status >= 500 or status in KEEP_4XX:
            after = parse_retry_after(resp.headers.get("Retry-After"))
            return Outcome("retry", retry_after=after, message=message, status=status,
                           code=code)
        return Outcome("reject", message=message, status=status, code=code)

    def close(self) -> None:
        if self._owned:
            self._http.close()


def _server_message(resp: httpx.Response) -> tuple[str, str]:
    """``("HTTP 422: <code>: <message>", code)`` from the collector's ``{"code",
    "message"}`` error body."""
    text = code = ""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        parts = [str(body[k])[:1000] for k in ("code", "message") if body.get(k)]
        text = ": ".join(parts)
        code = str(body.get("code") or "")[:64]
    if not text:
        text = resp.text[:500]
    return f"HTTP {resp.status_code}" + (f": {text}" if text else ""), code
