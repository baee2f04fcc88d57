"""Typed, validated configuration of the client (stdlib only).

Every field has a default; :meth:`ClientConfig.from_env` reads ``LOGITWATCH_<FIELD>``
variables (``LOGITWATCH_MAX_QUEUE=50000``) as *fallbacks* for the keyword arguments it is
given, so code wins over the environment and tests can inject their own environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ClientConfig"]

_ENV_PREFIX = "LOGITWATCH_"


@dataclass(frozen=True)
class ClientConfig:
    """How the client buffers and ships frames.

    Attributes:
        max_queue: Frames held in memory while waiting to be sent. From half of it on, the
            oldest frames are written to the disk spool; if memory is full all the same
            (spool disabled, disk too slow) the oldest frame is dropped and counted in
            ``stats["dropped_queue_full"]``.
        max_queue_bytes: The same bound in bytes (8 per value plus a small overhead per
            frame and metric), whichever is reached first.
        max_batch: Most frames in one ``POST /api/v1/ingest``. The sender thread is
            woken as soon as this many frames are waiting.
        interval: Seconds between two sends of whatever is waiting.
        timeout: Seconds of HTTP timeout (connect, read, write) for one request.
        max_backoff: Longest wait, in seconds, between two retries of a batch that
            failed with a connection error, 429 or 5xx (also the cap applied to a
            server's ``Retry-After``).
        exit_timeout: Seconds the interpreter-exit (atexit) shutdown waits for the
            queue to drain before giving up and reporting what was not delivered.
        token: API token with the ``ingest`` scope for the run's project, sent as
            ``Authorization: Bearer <token>``; needed once the collector has tokens
            (``logitwatch token create``). Read from ``LOGITWATCH_TOKEN`` if not given.
        spool_dir: Root of the crash-safe disk spool (default ``$LOGITWATCH_HOME/spool``
            when ``LOGITWATCH_HOME`` is set, else ``$XDG_CACHE_HOME/logitwatch/spool``, else
            ``~/.cache/logitwatch/spool``; ``logitwatch push`` reads it by default). Each
            process writes under ``<root>/<project>/<run>/rank-<rank>/<pid>-<start>``, and
            only when it must: the collector is unreachable or memory is half full.
        spool_max_bytes: Disk budget of one process's spool. Past it, the oldest spooled
            frames are dropped, counted in ``stats["dropped_spool_full"]``. The frames the
            collector refused, kept aside for a person to look at, count in it and take at
            most a tenth of it (then ``stats["dropped_aside"]``). 0 turns the spool off
            (frames then wait in memory only).
        spool_interval: Frames not delivered within this many seconds (the collector is
            unreachable or slow, or ``interval`` is longer) are written to the spool, the
            batch in flight included: the most a crash of the training process itself can
            lose.
        gzip_level: zlib level (1-9) used to compress request bodies of 1 KiB and more
            (``Content-Encoding: gzip``); 0 sends them uncompressed.
        max_metrics: Distinct metric names (scalars, matrices, history series) this client
            sends for its run; new names past it are left out of frames, with one log line.
            Keep it at or below the collector's ``max_metrics_per_run`` (1000 by default),
            which refuses a whole frame, loss included, that brings a name past its limit.
    """

    max_queue: int = 10_000
    max_batch: int = 256
    interval: float = 0.5
    timeout: float = 10.0
    max_backoff: float = 30.0
    exit_timeout: float = 5.0
    token: str | None = field(default=None, repr=False)
    max_queue_bytes: int = 128 * 1024 * 1024
    spool_dir: str | None = None
    spool_max_bytes: int = 1024**3
    spool_interval: float = 2.0
    gzip_level: int = 1
    max_metrics: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_batch", "max_queue_bytes", "max_metrics"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClientConfig.{name} must be an int >= 1, got {value!r}")
        for name, low, high in (("spool_max_bytes", 0, None), ("gzip_level", 0, 9)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int) or value < low
                    or (high is not None and value > high)):
                bounds = f"between {low} and {high}" if high is not None else f">= {low}"
                raise ValueError(f"ClientConfig.{name} must be an int {bounds}, got {value!r}")
        if self.spool_dir is not None and (
            not isinstance(self.spool_dir, str) or not self.spool_dir.strip()
        ):
            raise ValueError("ClientConfig.spool_dir must be a non-empty path or None")
        for name in ("interval", "timeout", "max_backoff", "exit_timeout", "spool_interval"):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value <= 0:
                raise ValueError(f"ClientConfig.{name} must be a finite number > 0, got {value!r}")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.strip()):
            raise ValueError("ClientConfig.token must be a non-empty string or None")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: Any
    ) -> ClientConfig:
        """Build a config from ``overrides``, falling back to ``LOGITWATCH_*`` variables.

        Args:
            env: The environment to read (default ``os.environ``); injectable for tests.
            **overrides: Field values that win over the environment.

        Raises:
            ValueError: A variable cannot be parsed or a value is out of range; the
                message names the field (and the variable).
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in overrides:
                values[f.name] = overrides.pop(f.name)
                continue
            var = _ENV_PREFIX + f.name.upper()
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            if f.name in ("token", "spool_dir"):
                values[f.name] = raw.strip()
                continue
            kind = int if isinstance(f.default, int) else float
            if kind is int:
                raw = raw.strip().replace("_", "")
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(
                    f"ClientConfig.{f.name}: cannot parse {var}={raw!r} as {kind.__name__}"
                ) from None
        if overrides:
            raise TypeError(f"ClientConfig has no field(s) {sorted(overrides)}")
        return cls(**values)

    def spool_root(self, env: Mapping[str, str] | None = None) -> str:
        """The spool root: ``spool_dir``, else ``$LOGITWATCH_HOME/spool`` when that is set,
        else the per-user cache directory."""
        if self.spool_dir is not None:
            return os.path.expanduser(self.spool_dir)
        env = os.environ if env is None else env
        home = env.get("LOGITWATCH_HOME", "").strip()
        if home:
            return os.path.join(os.path.expanduser(home), "spool")
        cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(cache, "logitwatch", "spool")
