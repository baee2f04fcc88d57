"""The public :class:`Client`: a non-blocking frame producer for the training thread."""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import threading
import time as _time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from logitwatch.wire import NAME_RE, encode_float

from ._http import IngestTransport
from ._queue import FrameQueue
from ._worker import Sender
from .config import ClientConfig

__all__ = ["AlertCallback", "Client"]

log = logging.getLogger("logitwatch.client")

AlertCallback = Callable[[dict[str, Any]], None]


class Client:
    """Queues frames (one per sampled step) and ships them to a collector in the background.

    :meth:`send` is safe on the training thread: it costs microseconds, never blocks on
    the network and never raises. A daemon thread posts batches to
    ``{url}/api/v1/ingest``; connection errors, 429 and 5xx are retried with backoff
    without losing frames; a full queue drops its oldest frame (counted).

    With ``url=None`` the client counts and discards frames (nothing is started).

    Args:
        url: Collector base URL (``http://127.0.0.1:8000``), or None to discard.
        run: Run name, 1-128 characters of ``[A-Za-z0-9._:-]``.
        project: Project name, same alphabet.
        rank: Data-parallel rank of this process (int >= 0).
        config: Queue, batch, timing settings; default ``ClientConfig.from_env()``.
        http: An ``httpx.Client`` to post with (tests, custom TLS/auth). The caller keeps
            ownership: it is not closed by :meth:`shutdown`.

    Raises:
        ValueError: ``run``, ``project`` or ``rank`` is invalid.
    """

    def __init__(
        self,
        url: str | None,
        *,
        run: str,
        project: str = "default",
        rank: int = 0,
        config: ClientConfig | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        for name, value in (("run", run), ("project", project)):
            if not isinstance(value, str) or not NAME_RE.match(value):
                raise ValueError(
                    f"Client {name} must be 1-128 characters of [A-Za-z0-9._:-], got {value!r}"
                )
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"Client rank must be an int >= 0, got {rank!r}")
        self.url = url
        self.run = run
        self.project = project
        self.rank = rank
        self.config = config if config is not None else ClientConfig.from_env()
        self._queue = FrameQueue(self.config.max_queue)
        # seq starts from the wall clock in microseconds, so a job restarted (or resumed from
        # a checkpoint) under the same run name never reuses a (run, rank, seq) key that the
        # collector would drop as a duplicate.
        self._seq = itertools.count(_time.time_ns() // 1000)
        self._callbacks: list[AlertCallback] = []
        self._seen_alerts: set[Any] = set()
        self._control: dict[str, Any] = {}
        self._closed = False
        self._close_lock = threading.Lock()
        self._send_failed = False
        self._sender: Sender | None = None
        if url is not None:
            transport = IngestTransport(
                url, timeout=self.config.timeout, http=http, token=self.config.token
            )
            self._sender = Sender(
                self._queue,
                transport,
                max_batch=self.config.max_batch,
                interval=self.config.interval,
                max_backoff=self.config.max_backoff,
                on_answer=self._handle_answer,
            )
            self._sender.start()
            atexit.register(self._atexit)

    # -- training thread -----------------------------------------------------------------

    def send(
        self,
        step: int,
        scalars: Mapping[str, float],
        heads: Mapping[str, Sequence[Sequence[float]]],
        time: float | None = None,
    ) -> None:
        """Queue one frame. Never blocks, never raises (failures are logged once).

        Args:
            step: Optimizer step of the frame.
            scalars: ``{"loss": 3.1, ...}``; NaN and infinities are allowed.
            heads: ``{"attn.logit_max": [[per head] per layer], ...}``.
            time: Unix seconds when the step ended (default: now).
        """
        try:
            if self._closed:
                self._queue.count("dropped_after_shutdown")
                return
            if self._sender is None:
                self._queue.count("queued")
                self._queue.count("discarded")
                return
            seq = next(self._seq)
            frame = {
                "run": self.run,
                "project": self.project,
                "rank": self.rank,
                "seq": seq,
                "step": int(step),
                "time": encode_float(float(_time.time() if time is None else time)),
                "scalars": {str(k): encode_float(float(v)) for k, v in scalars.items()},
                "heads": {
                    str(k): [[encode_float(float(x)) for x in row] for row in rows]
                    for k, rows in heads.items()
                },
            }
            if self._queue.put(seq, frame) >= self.config.max_batch:
                self._sender.wake()
        except Exception:
            if not self._send_failed:
                self._send_failed = True
                log.warning("logitwatch: Client.send failed; frame dropped", exc_info=True)

    def on_alert(self, callback: AlertCallback) -> AlertCallback:
        """Call ``callback(alert)`` once per new alert id the collector reports.

        Runs on the sender thread; exceptions are logged and swallowed. Returns the
        callback, so this works as a decorator.
        """
        self._callbacks.append(callback)
        return callback

    @property
    def control(self) -> dict[str, Any]:
        """The latest ``control`` object from the collector (``{}`` until the first answer)."""
        return self._control

    @property
    def stats(self) -> dict[str, int]:
        """Counters: queued, sent, batches, retries, dropped_queue_full, rejected, ...

        See ``logitwatch.client._queue.COUNTERS`` for the full list and meanings; counts
        are frames except ``batches`` and ``retries``.
        """
        counts = self._queue.counts()
        counts["pending"] = self._queue.pending()
        return counts

    # -- lifecycle -----------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; True iff every frame queued before the call was delivered."""
        if self._sender is None:
            return True
        if self._closed:
            return self._queue.pending() == 0 and not self._queue.counts()[
                "undelivered_at_shutdown"
            ]
        target = self._queue.last_seq
        if self._queue.pending():
            self._sender.wake(urgent=True)
        return self._queue.wait_handled(target, timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Send what remains, within ``timeout`` s, and stop. Idempotent; never raises.

        Frames still undelivered at the deadline are counted in
        ``stats["undelivered_at_shutdown"]`` and reported in one log line.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            atexit.unregister(self._atexit)
            if self._sender is None:
                return
            timeout = timeout if math.isfinite(timeout) else 3600.0
            self._sender.stop(_time.monotonic() + max(0.0, timeout))
            lost = self._queue.abandon("undelivered_at_shutdown")
            if lost:
                log.warning(
                    "logitwatch: %d frame(s) of run %r were NOT delivered to %s "
                    "(collector unreachable or too slow within the %.1f s shutdown timeout)",
                    lost,
                    self.run,
                    self.url,
                    timeout,
                )
        except Exception:
            log.warning("logitwatch: Client.shutdown failed", exc_info=True)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(self.config.exit_timeout)

    def _atexit(self) -> None:
        pending = self._queue.pending()
        if pending:
            log.info(
                "logitwatch: delivering %d queued frame(s) to %s before exit (up to %.1f s)",
                pending,
                self.url,
                self.config.exit_timeout,
            )
        self.shutdown(self.config.exit_timeout)

    # -- sender thread -------------------------------------------------------------------

    def _handle_answer(self, answer: dict[str, Any]) -> None:
        control = answer.get("control")
        if isinstance(control, dict):
            self._control = dict(control)  # replaced whole: readers never see a mix
        alerts = answer.get("alerts")
        if not isinstance(alerts, list):
            return
        for alert in alerts:
            if not isinstance(alert, dict) or "id" not in alert:
                continue
            key = alert["id"]
            if not isinstance(key, (int, str)) or key in self._seen_alerts:
                continue
            self._seen_alerts.add(key)
            for callback in list(self._callbacks):
                try:
                    callback(alert)
                except Exception:
                    log.warning(
                        "logitwatch: on_alert callback %r failed", callback, exc_info=True
                    )
