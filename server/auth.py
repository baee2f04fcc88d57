"""Who may do what: API tokens per project and scope, open mode, rate limits.

* **Open mode** — no token was ever created in the database, and the collector is bound to
  a loopback interface (or ``insecure_no_auth`` is set): every request is allowed. One person
  on one machine needs no ceremony.
* **Token mode** — as soon as one token exists (or ``require_tokens`` is set), every
  ``/api/v1`` request needs ``Authorization: Bearer <token>`` or the dashboard's session
  cookie. A ``read`` token reads the runs of its project only; an ``ingest`` token writes
  frames of its project only. Other projects' runs answer 404, as if they did not exist.
  Revoked tokens count: revoking the last token locks the collector, it never opens it.
* A non-loopback bind without any token and without ``insecure_no_auth`` refuses every
  request (and ``logitwatch serve`` refuses to start).

Token lookups and the "any token?" question are cached for ``auth_cache_seconds``, so a
request costs no query in the steady state; ``last_used_at`` is written at most once a
minute per token.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.db.session import session_scope
from logitwatch.server.errors import Forbidden, RateLimited, Unauthorized
from logitwatch.server.settings import Settings
from logitwatch.server.store.tokens import TokenInfo, count_tokens, find_token, touch_token

__all__ = ["Authenticator", "Principal", "TokenBuckets", "bind_refusal", "is_loopback"]

TOUCH_EVERY = 60.0  # seconds between writes of a token's last_used_at


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: a token (``project``, ``scope``) or, in open mode, anyone (``project``
    None: every project)."""

    token_id: int | None
    project: str | None
    scope: str  # "ingest", "read", or "open"
    name: str = ""

    @property
    def open(self) -> bool:
        return self.token_id is None

    def sees(self, project: str) -> bool:
        return self.project is None or self.project == project


OPEN = Principal(token_id=None, project=None, scope="open")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_refusal(settings: Settings, tokens: int, *, db_option: str = "") -> str | None:
    """Why the collector must not serve as configured (``tokens``: how many exist), or None
    when it may."""
    if tokens or is_loopback(settings.host) or settings.insecure_no_auth:
        return None
    db = f" {db_option}" if db_option else ""
    return (
        f"refusing to serve on {settings.host} without API tokens: anyone who can reach this "
        "port could read and write every run. Create tokens first, then start again:\n"
        f"  logitwatch token create --project default --scope ingest{db}   # for training jobs\n"
        f"  logitwatch token create --project default --scope read{db}     # for the dashboard\n"
        "or bind to 127.0.0.1 (the default) and put a TLS proxy in front, or, only on a "
        "trusted isolated network, pass --insecure-no-auth."
    )


class TokenBuckets:
    """One token bucket per key: ``rate`` per second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._state: dict[object, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def peek(self, key: object) -> float:
        """0.0 when ``key`` may make a request now, else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._state.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def take(self, key: object) -> float:
        """Spend one request; 0.0 when allowed, else the seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            if len(self._state) > 10_000:  # bounded: keys that are full again are forgotten
                full = [k for k, (t, a) in self._state.items()
                        if t + (now - a) * self.rate >= self.burst]
                for k in full:
                    del self._state[k]
            tokens, at = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


class Authenticator:
    """Turns credentials into a :class:`Principal` (one per app, on ``app.state.auth``)."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sessions, self.settings, self.clock = sessions, settings, clock
        self.buckets = TokenBuckets(settings.rate_limit_per_second, settings.rate_limit_burst,
                                    clock)
        # unknown or revoked tokens, per client address: guessing costs time and no query
        self.failures = TokenBuckets(settings.auth_failures_per_second,
                                     settings.auth_failures_burst, clock)
        self._lock = threading.Lock()
        self._count: tuple[int, float] | None = None  # (tokens, expires)
        self._tokens: dict[str, tuple[TokenInfo | None, float]] = {}  # secret -> (info, exp)
        self._touched: dict[int, float] = {}

    # --- cached lookups --------------------------------------------------------------------
    def tokens(self) -> int:
        """How many tokens exist, revoked ones included."""
        now = self.clock()
        cached = self._count
        if cached is not None and cached[1] > now:
            return cached[0]
        with session_scope(self.sessions) as s:
            n: int = count_tokens(s)
        self._count = (n, now + self.settings.auth_cache_seconds)
        return n

    def lookup(self, secret: str) -> TokenInfo | None:
        now = self.clock()
        hit = self._tokens.get(secret)
        if hit is not None and hit[1] > now:
            return hit[0]
        with session_scope(self.sessions) as s:
            info = find_token(s, secret=secret)
        with self._lock:
            if len(self._tokens) > 10_000:  # bounded: random garbage must not grow it
                self._tokens.clear()
            self._tokens[secret] = (info, now + self.settings.auth_cache_seconds)
        return info

    def _touch(self, info: TokenInfo) -> None:
        now = self.clock()
        with self._lock:
            if now - self._touched.get(info.id, -math.inf) < TOUCH_EVERY:
                return
            self._touched[info.id] = now
        with session_scope(self.sessions) as s:
            touch_token(s, token_id=info.id, now=time.time())

    # --- decisions -------------------------------------------------------------------------
    def open_mode(self) -> bool:
        s = self.settings
        if s.require_tokens:
            return False
        return self.tokens() == 0 and (is_loopback(s.host) or s.insecure_no_auth)

    def check_token(self, secret: str, client: str | None) -> TokenInfo | None:
        """The token behind ``secret`` (None: unknown), charging ``client`` (an address) for
        unknown and revoked ones: past ``auth_failures_burst`` of them it gets 429 without a
        lookup, until its failures refill at ``auth_failures_per_second``."""
        hit = self._tokens.get(secret)
        known = hit is not None and hit[0] is not None and hit[0].active
        if not known and client is not None:
            wait = self.failures.peek(client)
            if wait > 0:
                raise RateLimited(
                    "too-many-failures",
                    f"Authorization: too many unknown or revoked tokens from {client} "
                    f"(auth_failures_burst {self.settings.auth_failures_burst}); retry after "
                    "the Retry-After seconds", retry_after=max(1, math.ceil(wait)))
        info = self.lookup(secret)
        if (info is None or not info.active) and client is not None:
            self.failures.take(client)
        return info

    def authenticate(self, secret: str | None, client: str | None = None) -> Principal:
        """The caller behind ``secret``; raises :class:`Unauthorized`."""
        if self.open_mode():
            return OPEN
        if not secret:
            if self.tokens() == 0:
                raise Unauthorized(
                    "auth-required",
                    "this collector requires an API token, and none exists yet: create one "
                    "with `logitwatch token create --project <project> --scope read|ingest`",
                )
            raise Unauthorized(
                "auth-required",
                "Authorization: send 'Authorization: Bearer <token>' (create tokens with "
                "`logitwatch token create`), or log in on the dashboard with a read token",
            )
        info = self.check_token(secret, client)
        if info is None or not info.active:
            raise Unauthorized(
                "invalid-token",
                "Authorization: the token is unknown or revoked (see `logitwatch token list`)",
            )
        self._touch(info)
        return Principal(token_id=info.id, project=info.project, scope=info.scope,
                         name=info.name)

    def authorize(self, secret: str | None, *, scope: str | None,
                  charge: bool = True, client: str | None = None) -> Principal:
        """Authenticate, check ``scope`` (None: any), and spend one request of the token's
        rate; raises 401, 403 or 429 (``client``: the caller's address, charged for unknown
        tokens)."""
        p = self.authenticate(secret, client)
        if p.open:
            return p
        if scope is not None and p.scope != scope:
            raise Forbidden(
                "scope-forbidden",
                f"Authorization: this is a {p.scope} token of project {p.project!r}; this "
                f"request needs a {scope} token",
            )
        if charge:
            wait = self.buckets.take(p.token_id or 0)
            if wait > 0:
                s = self.settings
                raise RateLimited(
                    "rate-limited",
                    f"token {p.token_id} ({p.name}) made more than {s.rate_limit_burst} requests "
                    f"at once or {s.rate_limit_per_second:g}/s on average "
                    "(rate_limit_per_second); retry after the Retry-After seconds",
                    retry_after=max(1, math.ceil(wait)),
                )
        return p
