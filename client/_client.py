"""The public :class:`Client`: a non-blocking frame producer for the training thread."""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import re
import shlex
import threading
import time as _time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from logitwatch.wire import NAME_RE

from ._codec import NameBudget, Packed, encode, pack
from ._http import IngestTransport
from ._process import LIVE, exiting_on_exception
from ._queue import Backlog, warn_once
from ._runconfig import ConfigSender, clean_config
from ._spool import WriterDir
from ._url import normalize_url
from ._worker import Sender, Spooler
from .config import ClientConfig

__all__ = ["AlertCallback", "Client"]

log = logging.getLogger("logitwatch.client")

AlertCallback = Callable[[dict[str, Any]], None]

_CAUSE = re.compile(r"'[^']*'|\d+|\(.*")  # names, numbers, details: not part of a cause
#: The most alert (id, severity) pairs a client remembers reporting to ``on_alert``.
SEEN_ALERTS = 10_000


class Client:
    """Queues frames (one per sampled step) and ships them to a collector in the background.

    :meth:`send` is safe on the training thread: it costs microseconds, never touches the
    network or the disk, never waits and never raises. A daemon thread posts batches
    (``max_batch`` frames or every ``interval`` s, gzip-compressed) to
    ``{url}/api/v1/ingest``; another writes frames to a crash-safe disk spool when memory
    is half full or the collector is unreachable, slow or answering errors. Spooled frames
    are replayed in order once it answers again, and the collector's (run, rank, seq)
    deduplication makes every resend harmless: no frame is lost or counted twice. Drops
    happen only at a configured bound, counted by reason in :attr:`stats`.

    Shutdown (:meth:`shutdown`, ``with``, or interpreter exit) sends what it can within
    its timeout and leaves the rest in the spool, with one log line that says how to send
    it later (``logitwatch push DIR``). It first says that the job ended (:meth:`finish`:
    the run becomes ``finished`` on the collector), unless the job is ending on an
    exception: ``with`` left by one, ``shutdown(finished=False)``, or an interpreter exiting
    on an uncaught exception, whose run the collector's ``no_data`` rule then reports as
    ``stopped``.

    Thread-safe (any thread may call :meth:`send`) and fork-safe: a forked child
    (DataLoader worker, ``torch.multiprocessing``) starts with an empty queue, new threads
    and locks, and a spool directory of its own, so nothing the parent queued is sent
    twice. Each rank of a multi-process job creates its own client with its ``rank``; the
    collector merges the ranks of a run.

    With ``url=None`` the client counts and discards frames (nothing is started).

    Args:
        url: Collector base URL (``http://127.0.0.1:8000``), or None to discard.
        run: Run name, 1-128 characters of ``[A-Za-z0-9._:-]``.
        project: Project name, same alphabet.
        rank: Data-parallel rank of this process (int >= 0).
        config: Queue, batch, spool, timing settings; default ``ClientConfig.from_env()``.
        http: An ``httpx.Client`` to post with (tests, custom TLS/auth). The caller keeps
            ownership: it is not closed by :meth:`shutdown`. A forked child builds its own.

    Raises:
        ValueError: ``url``, ``run``, ``project`` or ``rank`` is invalid. A URL without a
            scheme, or with the API path appended (``.../api/v1``), is corrected with a
            warning instead (``client/_url.py``).
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
            if not isinstance(value, str) or not NAME_RE.fullmatch(value):
                raise ValueError(
                    f"Client {name} must be 1-128 characters of [A-Za-z0-9._:-], got {value!r}"
                )
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"Client rank must be an int >= 0, got {rank!r}")
        self.url = normalize_url(url) if url is not None else None
        self.run = run
        self.project = project
        self.rank = rank
        self.config = config if config is not None else ClientConfig.from_env()
        self._http = http
        self._http_pid = os.getpid()
        self._callbacks: list[AlertCallback] = []
        self._annotators: list[AlertCallback] = []
        self._seen_alerts: dict[Any, None] = {}  # (id, severity), oldest first
        self._control: dict[str, Any] = {}
        self._closed = False
        self._warned: set[str] = set()
        # the run's metric names so far (a forked child inherits them: same run)
        self._names = NameBudget(self.config.max_metrics)
        self._answered = threading.Event()  # the collector answered a batch: the run exists
        self._config_sender: ConfigSender | None = None
        self._build()
        if url is not None:
            self._start()
            atexit.register(self._atexit)
            LIVE.add(self)

    def _build(self) -> None:
        """Fresh queue, locks and (unstarted) threads: at construction and after a fork."""
        cfg = self.config
        self._close_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._started = self.url is None
        self._last_step = -1  # the highest step sent (this process)
        self._end_seq = -1  # the seq of the last end frame queued
        self._spool = WriterDir(cfg.spool_root(), project=self.project, run=self.run,
                                rank=self.rank, url=self.url)
        self._backlog = Backlog(
            max_frames=cfg.max_queue, max_bytes=cfg.max_queue_bytes, max_batch=cfg.max_batch,
            encode=functools.partial(encode, run=self.run, project=self.project,
                                     rank=self.rank),
            spool=self._spool, spool_max_bytes=cfg.spool_max_bytes,
        )
        self._sender: Sender | None = None
        self._spooler: Spooler | None = None
        if self.url is not None:
            self._spooler = Spooler(self._backlog, interval=cfg.spool_interval)
            self._sender = Sender(
                self._backlog, self._transport, max_batch=cfg.max_batch,
                interval=cfg.interval, max_backoff=cfg.max_backoff,
                on_answer=self._handle_answer, on_down=self._spooler.wake,
            )
            self._high_frames = self._spooler.high_frames
            self._high_bytes = self._spooler.high_bytes

    def _transport(self) -> IngestTransport:
        """Built on the sender thread (an SSL context costs milliseconds)."""
        assert self.url is not None
        http = self._http if self._http_pid == os.getpid() else None
        return IngestTransport(
            self.url, timeout=self.config.timeout, http=http, token=self.config.token,
            gzip_level=self.config.gzip_level,
            user_agent=f"logitwatch-client (rank {self.rank}; pid {os.getpid()})",
        )

    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            assert self._sender is not None and self._spooler is not None
            self._sender.start()
            self._spooler.start()
            self._started = True

    def _after_fork(self) -> None:
        """In a forked child: drop everything inherited; threads start on the first send."""
        self._spool.forget()
        self._config_sender = None  # the parent's to send
        self._build()

    # -- training thread -----------------------------------------------------------------

    def send(
        self,
        step: int,
        scalars: Mapping[str, float],
        heads: Mapping[str, Sequence[Sequence[float]]],
        time: float | None = None,
        history: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue one frame. Never blocks, never raises (problems are logged once).

        Args:
            step: Optimizer step of the frame (int in [0, 2**62]).
            scalars: ``{"loss": 3.1, ...}``; NaN and infinities are kept as they are.
            heads: ``{"attn.logit_max": [[per head] per layer], ...}``; the numbers are
                copied, so the caller may reuse its lists.
            time: Unix seconds when the step ended (default: now).
            history: Scalars of the steps since this rank's previous frame, ``{"steps":
                [int, ...], "scalars": {name: [float | None, ...]}}`` (one value per step,
                None where a step did not measure it; see ``logitwatch.wire``), copied too.
                A bad history is left out, the frame is sent.
        """
        try:
            if self._closed:
                self._backlog.count("dropped_after_shutdown")
                return
            sender = self._sender
            if sender is None:
                self._backlog.count("queued")
                self._backlog.count("discarded")
                return
            if not self._started:
                self._start()
            try:
                frame, problems = pack(step, scalars, heads, time, history, self._names)
            except (ValueError, TypeError, OverflowError, AttributeError) as e:
                self._backlog.count("invalid")
                self._warn_once("invalid", "logitwatch: Client.send dropped a frame: %s", e)
                return
            if problems:
                # one line per cause, whatever the names and numbers in it
                self._warn_once("problems:" + _CAUSE.sub("", problems[0]),
                                "logitwatch: Client.send left out %s (further frames with "
                                "this problem are not logged)", "; ".join(problems))
            if frame.step > self._last_step:
                self._last_step = frame.step
            backlog = self._backlog
            n = backlog.put(frame, _time.time_ns() // 1000)
            if n >= self.config.max_batch and not sender.woken:
                sender.wake()
            if n > self._high_frames or backlog.mem_bytes > self._high_bytes:
                assert self._spooler is not None
                self._spooler.wake()
        except Exception:
            self._warn_once("send", "logitwatch: Client.send failed; frame dropped",
                            exc_info=True)

    def set_config(self, config: Mapping[str, Any]) -> None:
        """Send the run's configuration (a dict of JSON values: hyperparameters, model,
        data), shown in ``GET /runs``: once, in the background, after the collector's
        first answer, retried as frames are (``client/_runconfig.py``). Never blocks or
        raises; values JSON cannot carry are left out. A later call replaces it."""
        try:
            if self._closed or self.url is None:
                return
            body, left = clean_config(config)
            if left:
                self._warn_once("config-left", "logitwatch: the run's config leaves out %s "
                                "(not JSON values, or past 256 keys / 16 KiB)",
                                ", ".join(left[:10]) + (" ..." if len(left) > 10 else ""))
            http = self._http if self._http_pid == os.getpid() else None
            self._config_sender = ConfigSender(
                self.url, run=self.run, project=self.project, body=body,
                token=self.config.token, timeout=self.config.timeout,
                max_backoff=self.config.max_backoff, http=http, ready=self._answered,
                user_agent=f"logitwatch-client (rank {self.rank}; pid {os.getpid()})",
                after=self._config_sender,  # a later call replaces it: one at a time
            ).start()
        except Exception:
            self._warn_once("config", "logitwatch: Client.set_config failed; the config is "
                            "not sent", exc_info=True)

    def on_alert(self, callback: AlertCallback) -> AlertCallback:
        """Call ``callback(alert)`` once per new alert id the collector reports for this
        run (the alert as in ``GET /api/v1/runs/{id}/alerts``), and once more when that
        alert's severity changes (an ``info`` alert escalated to ``warning``).

        Runs on the sender thread; exceptions are logged and swallowed. Returns the
        callback, so this works as a decorator.
        """
        self._callbacks.append(callback)
        return callback

    def add_alert_annotator(self, annotator: AlertCallback) -> None:
        """Call ``annotator(alert)`` on each new alert before the :meth:`on_alert`
        callbacks, on a copy they then receive: it may add keys (the hooks' fuses add
        ``"fuses"``, the fuses that address the alert). Sender thread; exceptions are
        logged and swallowed."""
        self._annotators.append(annotator)

    @property
    def control(self) -> dict[str, Any]:
        """The latest ``control`` object from the collector (``{}`` until the first answer).

        ``{"sample_every": N}`` while the run has a firing alert (the hooks then sample
        every N steps); ``{}`` otherwise. ``{"fuses": {name: "apply" | "undo"}}``: a
        person applies or undoes one of the job's fuses (docs/FUSES.md).
        """
        return self._control

    @property
    def stats(self) -> dict[str, int]:
        """Counters, plus ``pending`` (frames not yet delivered: memory, in flight and
        spool), ``spooled`` (frames in the spool) and ``spool_bytes``.

        See ``logitwatch.client._queue.COUNTERS`` for the counters and their meanings;
        counts are frames except ``batches`` and ``retries``.
        """
        counts = self._backlog.counts()
        counts["pending"] = self._backlog.pending()
        counts["spooled"], counts["spool_bytes"] = self._backlog.spooled()
        return counts

    @property
    def spool_path(self) -> str | None:
        """This process's spool directory, once something was written to it."""
        path = self._spool.path
        return None if path is None else str(path)

    # -- lifecycle -----------------------------------------------------------------------

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; True iff every frame queued before the call was delivered."""
        if self._sender is None:
            return True
        timeout = timeout if math.isfinite(timeout) else 3600.0  # as shutdown's
        if self._closed:
            counts = self._backlog.counts()
            return self._backlog.pending() == 0 and not counts["undelivered_at_shutdown"]
        target = self._backlog.last_seq
        if self._backlog.pending():
            self._sender.wake(urgent=True)
        return self._backlog.wait_handled(target, timeout)

    def finish(self, step: int | None = None) -> None:
        """Say that the job ended normally: queue an end frame (``"end": "finished"``)
        after everything sent so far. Rank 0's makes the run ``finished`` on the collector
        (no ``no_data`` alert for it); a frame sent later makes it ``running`` again.

        Args:
            step: The job's last step (default, and at least: the highest step sent).

        :meth:`shutdown` does it (also at interpreter exit, unless on an uncaught
        exception), so call it only to say so earlier. Nothing is sent by a client that
        has sent no frame, nor twice in a row. Never blocks, never raises.
        """
        with self._close_lock:
            if not self._closed:
                self._queue_end(step)

    def _queue_end(self, step: int | None = None) -> None:
        try:
            sender = self._sender
            if sender is None or self._last_step < 0 or self._backlog.last_seq == self._end_seq:
                return
            last = self._last_step if step is None else max(self._last_step, int(step))
            frame = Packed(last, _time.time(), {}, {}, 200)
            frame.end = "finished"
            self._backlog.put(frame, _time.time_ns() // 1000)
            self._end_seq = self._backlog.last_seq
            sender.wake()
        except Exception:
            self._warn_once("end", "logitwatch: could not queue the end frame", exc_info=True)

    def shutdown(self, timeout: float = 10.0, *, finished: bool = True) -> None:
        """Send what remains within ``timeout`` s, keep the rest in the spool, and stop.

        With ``finished`` (default), first say that the job ended (:meth:`finish`); pass
        False when it is ending on an error, so the collector's ``no_data`` rule reports
        the run as ``stopped`` instead.

        Idempotent; never raises. Frames left in the spool are reported in one log line
        with the command that sends them (``logitwatch push DIR``); frames that could not
        even be spooled are counted in ``stats["undelivered_at_shutdown"]``.
        """
        with self._close_lock:
            if self._closed:
                return
            if finished:
                self._queue_end()  # the last frame: delivered, or spooled, with the rest
            self._closed = True
        try:
            atexit.unregister(self._atexit)
            if self._sender is None or not self._started:
                return
            timeout = timeout if math.isfinite(timeout) else 3600.0
            deadline = _time.monotonic() + max(0.0, timeout)
            self._sender.stop(deadline)
            config = self._config_sender
            if config is not None and not config.done.is_set():
                config.finish(deadline)  # the frames are in: one last try
            assert self._spooler is not None
            # at least half a second for the spooler to finish the segment it is writing
            deadline = max(deadline, _time.monotonic() + 0.5)
            self._spooler.stop(deadline - _time.monotonic())
            spooled, lost = self._backlog.close(deadline)
            self._report(spooled, lost, timeout)
            self._spool.release()
        except Exception:
            log.warning("logitwatch: Client.shutdown failed", exc_info=True)

    def _report(self, spooled: int, lost: int, timeout: float) -> None:
        counts = self._backlog.counts()
        drops = {k: counts[k] for k in ("dropped_queue_full", "dropped_spool_full",
                                        "dropped_spool_corrupt", "rejected", "quarantined")
                 if counts[k]}
        where = f"run {self.run!r} rank {self.rank}"
        if spooled:
            path = str(self._spool.path)
            log.warning(
                "logitwatch: %d frame(s) of %s were not delivered to %s within the %.1f s "
                "shutdown timeout; they are kept in the spool %s. Send them when the "
                "collector is up with:  logitwatch push %s --url %s",
                spooled, where, self.url, timeout, path, shlex.quote(path),
                shlex.quote(self.url or ""),
            )
        if lost:
            log.warning(
                "logitwatch: %d frame(s) of %s were NOT delivered to %s and could not be "
                "spooled (spool off, disk failing, or still being written to it at the "
                "shutdown deadline); they are lost",
                lost, where, self.url,
            )
        if drops:
            log.warning("logitwatch: frames of %s dropped during the run, by reason: %s",
                        where, ", ".join(f"{k}={v}" for k, v in drops.items()))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.shutdown(self.config.exit_timeout, finished=exc_type is None)

    def _atexit(self) -> None:
        crashed = exiting_on_exception()
        if crashed and self._last_step >= 0:
            log.info("logitwatch: exiting on an uncaught exception: run %r is not marked "
                     "finished (the collector reports it stopped once no data comes)", self.run)
        pending = self._backlog.pending()
        if pending:
            log.info(
                "logitwatch: delivering %d frame(s) to %s before exit (up to %.1f s; what "
                "is left stays in the disk spool)",
                pending, self.url, self.config.exit_timeout,
            )
        self.shutdown(self.config.exit_timeout, finished=not crashed)

    # -- sender thread -------------------------------------------------------------------

    def _handle_answer(self, answer: dict[str, Any]) -> None:
        self._answered.set()
        control = answer.get("control")
        if isinstance(control, dict):
            self._control = dict(control)  # replaced whole: readers never see a mix
        alerts = answer.get("alerts")
        if not isinstance(alerts, list):
            return
        for alert in alerts:
            if not isinstance(alert, dict) or "id" not in alert:
                continue
            if alert.get("run", self.run) != self.run:
                continue
            aid = alert["id"]
            if not isinstance(aid, (int, str)):
                continue
            # an escalated alert (info -> warning, same id) is news to the job as well
            key = (aid, str(alert.get("severity", "")))
            if key in self._seen_alerts:
                continue
            self._seen_alerts[key] = None
            if len(self._seen_alerts) > SEEN_ALERTS:  # a month of alerts: forget the oldest
                for old in list(self._seen_alerts)[: SEEN_ALERTS // 10]:
                    del self._seen_alerts[old]
            if self._annotators:
                alert = dict(alert)
                for annotator in list(self._annotators):
                    try:
                        annotator(alert)
                    except Exception:
                        log.warning("logitwatch: alert annotator %r failed", annotator,
                                    exc_info=True)
            for callback in list(self._callbacks):
                try:
                    callback(alert)
                except Exception:
                    log.warning(
                        "logitwatch: on_alert callback %r failed", callback, exc_info=True
                    )

    def _warn_once(self, key: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        warn_once(self._warned, key, msg, *args, exc_info=exc_info)
