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
        max_queue: Frames held in memory while waiting to be sent. When full, the
            oldest frame is dropped and counted in ``stats["dropped_queue_full"]``.
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
    """

    max_queue: int = 10_000
    max_batch: int = 256
    interval: float = 0.5
    timeout: float = 10.0
    max_backoff: float = 30.0
    exit_timeout: float = 5.0
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ClientConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("interval", "timeout", "max_backoff", "exit_timeout"):
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
            if f.name == "token":
                values[f.name] = raw.strip()
                continue
            kind = int if isinstance(f.default, int) else float
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(
                    f"ClientConfig.{f.name}: cannot parse {var}={raw!r} as {kind.__name__}"
                ) from None
        if overrides:
            raise TypeError(f"ClientConfig has no field(s) {sorted(overrides)}")
        return cls(**values)
