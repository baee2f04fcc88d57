"""Collector settings: typed, documented, validated at construction.

Every field can be given as a constructor argument; ``LOGITWATCH_<FIELD>`` environment
variables are fallbacks (e.g. ``LOGITWATCH_DB_URL``).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "default_db_url"]


def default_db_url() -> str:
    """The default store: the SQLite file ``logitwatch.db`` in logitwatch's home
    (``LOGITWATCH_HOME``, else the per-user data directory; see :mod:`logitwatch.paths`),
    the same from any working directory."""
    from logitwatch.paths import default_db_url as in_home

    return in_home()


class Settings(BaseSettings):
    """Configuration of one collector process."""

    model_config = SettingsConfigDict(env_prefix="LOGITWATCH_", extra="forbid")

    db_url: str = Field(
        default_factory=default_db_url,
        description="SQLAlchemy URL: sqlite:///path.db or "
        "postgresql+psycopg://user:pw@host:5432/db. Default: sqlite:///<home>/logitwatch.db, "
        "home being LOGITWATCH_HOME, else ~/.local/share/logitwatch ($XDG_DATA_HOME).",
    )
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    webhook_url: str | None = Field(
        None, description="If set, every alert that pages (warning or critical, at once or "
        "once escalated) is POSTed here as JSON when it fires, escalates and resolves."
    )
    webhook_info: bool = Field(
        False, description="Also POST the alerts that never paged (info: shown on the "
        "dashboard, such as a loss bump that recovered) to the webhook."
    )
    webhook_timeout: float = Field(5.0, gt=0, description="Seconds per webhook attempt.")
    webhook_retries: int = Field(
        5, ge=0, description="Retries per webhook delivery without a database (the "
        "collector's outbox retries a failing receiver for an hour instead).")
    # --- database connections (see docs/ARCHITECTURE.md, "Storage") ----------------------
    pool_size: int = Field(
        5, ge=1,
        description="Database connections this process keeps open. Requests run on a "
        "40-thread pool, and most hold a connection for a few milliseconds, so 5 serve "
        "hundreds of requests a second; on PostgreSQL, collectors x (pool_size + "
        "pool_max_overflow) must stay below the server's max_connections (100 by default).",
    )
    pool_max_overflow: int = Field(
        5, ge=0, description="Extra connections opened under bursts, closed when idle."
    )
    pool_timeout: float = Field(
        5.0, gt=0,
        description="Seconds a request waits for a free connection of the pool before it is "
        "answered 503 db-busy with Retry-After (a locked SQLite file is waited for 30 s); "
        "the client then spools and retries, so nothing accepted is lost and nothing hangs.",
    )
    # --- retention ---------------------------------------------------------------------
    retention_days: float | None = Field(
        None, gt=0,
        description="Thin the per-head matrices of frames older than this many days (None: "
        "keep everything). Scalars (loss, grad norm, lr) are always kept at full resolution.",
    )
    retention_drop_days: float | None = Field(
        None, gt=0,
        description="Delete frames older than this many days with all their values, scalars "
        "included (None: never). On PostgreSQL whole day partitions are dropped, once the "
        "whole day is older; on SQLite rows are deleted.",
    )
    retention_bucket_steps: int = Field(
        100, ge=1,
        description="After thinning, one frame's matrices per this many steps remain: the "
        "frame with the bucket's largest value (non-finite first), so spikes survive.",
    )
    retention_interval: float = Field(
        3600.0, gt=0,
        description="Seconds between retention passes (when retention_days or "
        "retention_drop_days is set)."
    )
    run_active_seconds: float = Field(
        600.0, gt=0,
        description="A run whose last frame is younger than this is 'active', else 'idle' "
        "(the status filter of GET /api/v1/runs).",
    )
    stream_interval: float = Field(
        1.0, gt=0, description="Seconds between polls of the store by each live stream."
    )
    stream_max_per_principal: int = Field(
        32, ge=1, description="Live streams one token (or, without auth, one client address) "
        "may hold open at once; past it a new stream is answered 429 streams-busy.",
    )
    stream_max_total: int = Field(
        256, ge=1, description="Live streams this process serves at once, all callers "
        "together; past it a new stream is answered 429 streams-busy.",
    )
    # --- limits: each is answered with a 4xx that names it, and nothing is stored ---------
    max_request_bytes: int = Field(
        32 * 1024 * 1024, ge=1024,
        description="Largest request body in bytes; larger ones get 413 request-too-large "
        "(counted while reading, whatever Content-Length says).",
    )
    max_frames_per_request: int = Field(
        10_000, ge=1, le=10_000, description="Frames per ingest batch (422 too-many-frames)."
    )
    max_values_per_matrix: int = Field(
        65_536, ge=1, le=65_536,
        description="Values (layers x heads) in one per-head matrix (422 matrix-too-large).",
    )
    max_metrics_per_run: int = Field(
        1000, ge=1,
        description="Distinct metric names a run may have: a label-cardinality guard "
        "(422 too-many-metrics).",
    )
    rate_limit_per_second: float = Field(
        50.0, ge=0,
        description="Requests per second each API token may make, on average (token bucket; "
        "429 rate-limited with Retry-After). 0 turns the limit off.",
    )
    rate_limit_burst: int = Field(
        200, ge=1, description="Requests a token may make at once before the rate applies."
    )
    # --- connections: slow or piled-up clients (server/serving.py) -------------------------
    header_timeout: float = Field(
        10.0, gt=0,
        description="Seconds a connection may take to send a request's headers, from when "
        "it opens or its previous answer was sent; then it is closed (slow clients cannot "
        "hold connections for ever).",
    )
    body_timeout: float = Field(
        60.0, gt=0,
        description="Seconds a request body may take to arrive (408 request-timeout).",
    )
    keep_alive_timeout: float = Field(
        5.0, gt=0, description="Seconds an idle keep-alive connection stays open.")
    max_connections: int = Field(
        900, ge=8,
        description="Open connections at most (lowered to the open-file limit minus 64); a "
        "new connection past it closes the oldest one with no request in progress.",
    )
    limit_concurrency: int | None = Field(
        None, ge=1,
        description="uvicorn's limit_concurrency: past this many connections or requests in "
        "progress, requests are answered 503 (the client retries). None: no such limit "
        "(max_connections still holds); keep it above max_connections to leave room for "
        "the live streams of dashboards.",
    )
    auth_failures_burst: int = Field(
        20, ge=1,
        description="Unknown or revoked tokens one client address may present at once; "
        "past them it gets 429 too-many-failures (no database lookup) until they refill.",
    )
    auth_failures_per_second: float = Field(
        1.0, ge=0, description="How fast a client address's allowance of unknown tokens "
        "refills (0: no limit).")
    # --- authentication (see README, SECURITY) -------------------------------------------
    require_tokens: bool = Field(
        False,
        description="Refuse every API request without a valid token, even while no token "
        "exists. Set it when the collector sits behind a proxy on the same host.",
    )
    insecure_no_auth: bool = Field(
        False,
        description="Allow a non-loopback bind without any API token: anyone who can reach "
        "the port reads and writes every run. Only for a trusted, isolated network.",
    )
    auth_cache_seconds: float = Field(
        2.0, ge=0,
        description="How long token lookups are cached; a token created or revoked with the "
        "CLI takes effect within this many seconds.",
    )
    allowed_hosts: str | None = Field(
        None,
        description="Host names the collector answers to, comma-separated, besides the "
        "loopback names (localhost, 127.0.0.1, [::1]) and the bound address; '*' answers "
        "to any. A request naming another host gets 421 host-not-allowed: that is how a "
        "page of another site reaching this collector through DNS rebinding shows. Set it "
        "to the public name behind a proxy that passes the Host header on (Caddy). Unset "
        "on a wildcard bind (0.0.0.0, ::): no check.",
    )
    secure_cookies: bool = Field(
        False,
        description="Mark the dashboard's session cookie Secure even when the request did "
        "not arrive over https (it is Secure on https requests anyway).",
    )
    # The parameters of the rule attn_logit_rising, which is off by default (enable it in a
    # rules file); the default rules that judge logits are attn_logit_departure and
    # attn_logit_forecast (server/alerts/defaults.py), tuned by a rules file.
    alert_logit_threshold: float | None = Field(
        None, gt=0, description="attn_logit_rising (off by default): a ceiling, if set: a "
        "head's max logit above it is alarming on any model, whatever its own baseline. "
        "Unset (none): no ceiling; only factor and floor apply."
    )
    alert_logit_factor: float = Field(
        4.0, gt=1, description="attn_logit_rising (off by default): a max logit above "
        "factor x its own baseline is alarming."
    )
    alert_logit_floor: float = Field(
        30.0,
        ge=0,
        description="attn_logit_rising (off by default): relative alarms only above this "
        "level: healthy heads sit around 5-20 "
        "(see README), so a head growing 4x from 2 to 8 is not news; from 10 to 40 it is.",
    )
    alert_for_samples: int = Field(
        3, ge=1, description="attn_logit_rising (off by default): consecutive samples its "
        "condition must hold before firing."
    )
    alert_sample_every: int = Field(
        1, ge=0,
        description="While a run has a firing alert, every ingest answer asks its jobs to "
        "sample every this many steps (control {'sample_every': N}), so the trouble is seen "
        "step by step; 0 never changes the jobs' own sampling.",
    )

    alert_state_max_ranks: int = Field(
        2000, ge=0,
        description="The alert engine keeps the rules' memory of this many (run, rank)s at "
        "most, the least recently seen dropped first; a (run, rank) that sends again is "
        "rebuilt from the store, as after a restart. Each costs about 0.75 MB once it has "
        "sent a thousand steps (bench/bench_engine_memory.py: 24 layers x 16 heads), so 2,000 "
        "hold about 1.5 GB: lower it on a small machine.",
    )
    alert_state_idle_seconds: float = Field(
        1800.0, ge=0,
        description="The rules' memory of a (run, rank) without frames for this long is "
        "dropped (rebuilt from the store if it sends again).",
    )

    @model_validator(mode="after")
    def _check_auth(self) -> Settings:
        if self.require_tokens and self.insecure_no_auth:
            raise ValueError(
                "require_tokens and insecure_no_auth contradict each other: choose one"
            )
        return self

    @field_validator("retention_days", "retention_drop_days", "alert_logit_threshold",
                     mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        # docker-compose passes an unset variable as "": retention off, no ceiling.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook(cls, v: str | None) -> str | None:
        """An http(s) URL with a host, refused at startup rather than at the first alert."""
        if v is None or not v.strip():
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook_url must be an http:// or https:// URL with a host, "
                             f"got {v!r}")
        return v.strip()

    @field_validator("db_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not (v.startswith("sqlite") or v.startswith("postgresql")):
            raise ValueError(
                f"db_url must be a sqlite:/// or postgresql+psycopg:// URL, got {v.split(':')[0]!r}"
            )
        return v
