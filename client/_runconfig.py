"""A run's configuration (hyperparameters...), sent once to ``PUT /api/v1/runs/{run}/config``.

:func:`clean_config` keeps what JSON can carry (strings, finite numbers, booleans, null,
and lists and objects of those), within the collector's bounds (256 keys, 16 KiB of JSON).
:class:`ConfigSender` puts it on a daemon thread of its own once the collector has
answered a batch of frames (the run exists then), and retries as the frames are retried:
network errors, 5xx and the 4xx after which frames are kept (401, 403, 404, 408, 409, 429,
...) are tried again with the same backoff; another 4xx (a config the collector refuses)
is logged once and dropped. Nothing here raises into training.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time as _time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from ._http import KEEP_4XX, backoff_delay, parse_retry_after, shared_ssl_context

__all__ = ["MAX_CONFIG_BYTES", "MAX_CONFIG_KEYS", "ConfigSender", "clean_config"]

log = logging.getLogger("logitwatch.client")

#: The collector's bounds (``PUT /runs/{run}/config``).
MAX_CONFIG_KEYS = 256
MAX_CONFIG_BYTES = 16_384
#: A string value longer than this is cut (a path, a long description).
MAX_STRING = 1000
_DEPTH = 4


def _clean(value: Any, depth: int) -> tuple[bool, Any]:
    """(kept, the JSON value) of one config value."""
    if value is None or isinstance(value, (bool, str)):
        return True, value[:MAX_STRING] if isinstance(value, str) else value
    if isinstance(value, int):
        return True, int(value)
    if isinstance(value, float):
        return math.isfinite(value), float(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        try:
            return _clean(value.item(), depth)
        except Exception:  # noqa: BLE001 - not a number after all
            return False, None
    if depth >= _DEPTH:
        return False, None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            kept, v = _clean(v, depth + 1)
            if kept and isinstance(k, str):
                out[k] = v
        return True, out
    if isinstance(value, (list, tuple)):
        items = [_clean(v, depth + 1) for v in value]
        return True, [v for kept, v in items if kept]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), (str, int)):
        return True, value.value  # an enum (HF's IntervalStrategy, ...)
    return False, None


def clean_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The JSON object to send and what was left out (names, for one log line)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict of JSON values, got {type(config).__name__}")
    out: dict[str, Any] = {}
    left: list[str] = []
    for key, value in config.items():
        name = str(key)[:128]
        kept, v = _clean(value, 0)
        if kept:
            out[name] = v
        else:
            left.append(name)
    def size() -> int:
        return len(json.dumps(out, separators=(",", ":")).encode())

    while out and (len(out) > MAX_CONFIG_KEYS or size() > MAX_CONFIG_BYTES):
        # drop the largest values first: a long list or text, not the hyperparameters
        name = max(out, key=lambda k: len(json.dumps(out[k], separators=(",", ":"))))
        del out[name]
        left.append(name)
    return out, left


class ConfigSender:
    """Puts one run's config in the background; see the module docstring."""

    def __init__(self, url: str, *, run: str, project: str, body: dict[str, Any],
                 token: str | None, timeout: float, max_backoff: float,
                 http: httpx.Client | None, user_agent: str,
                 ready: threading.Event, after: ConfigSender | None = None) -> None:
        self.endpoint = f"{url}/api/v1/runs/{quote(run, safe='')}/config"
        self.params = {"project": project}
        self.body = body
        self.headers = {"User-Agent": user_agent}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout, self.max_backoff = timeout, max_backoff
        self._http = http
        self._ready = ready  # set once the collector answered a batch: the run exists
        self._wake = threading.Event()
        self._last_try = False
        self._superseded = False
        self._after = after  # the sender of an earlier config: it stops, then this one puts
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="logitwatch-config",
                                        daemon=True)

    def start(self) -> ConfigSender:
        self._thread.start()
        return self

    def supersede(self) -> None:
        """A later config replaces this one: stop before the next try."""
        self._superseded = True
        self._wake.set()

    def finish(self, deadline: float) -> None:
        """At shutdown, after the frames: one more try now, until ``deadline``
        (``time.monotonic()``)."""
        self._last_try = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - _time.monotonic()))

    def _put(self, http: httpx.Client) -> tuple[bool, float | None]:
        """(finished, retry-after): finished when stored or refused for good."""
        try:
            r = http.put(self.endpoint, params=self.params, json=self.body,
                         headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            log.debug("logitwatch: sending the run's config failed: %s", e)
            return False, None
        if r.status_code < 300:
            return True, None
        if r.status_code >= 500 or r.status_code in KEEP_4XX:
            return False, parse_retry_after(r.headers.get("Retry-After"))
        log.warning("logitwatch: the collector refused the run's config (%d): %s; it is not "
                    "sent again", r.status_code, r.text[:300])
        return True, None

    def _loop(self) -> None:
        own = self._http is None
        http = self._http or httpx.Client(timeout=self.timeout, verify=shared_ssl_context())
        try:
            if self._after is not None:  # its PUT in flight lands first, never after ours
                self._after.supersede()
                self._after.done.wait(self.timeout + 1.0)
                self._after = None
            attempt = 0
            while not self._superseded:
                while not (self._ready.is_set() or self._last_try or self._superseded):
                    self._wake.wait(0.5)
                if self._superseded:
                    break
                finished, after = self._put(http)
                if finished or self._last_try:
                    break
                self._wake.wait(backoff_delay(attempt, max_backoff=self.max_backoff,
                                              retry_after=after))
                attempt += 1
        except Exception:  # never let the thread die loudly
            log.warning("logitwatch: sending the run's config failed", exc_info=True)
        finally:
            self.done.set()
            if own:
                http.close()
