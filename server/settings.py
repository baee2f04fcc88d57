"""Collector settings: typed, documented, validated at construction.

Every field can be given as a constructor argument; ``LOGITWATCH_<FIELD>`` environment
variables are fallbacks (e.g. ``LOGITWATCH_DB_URL``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "default_db_url"]


def default_db_url() -> str:
    """The embedded default: a SQLite file in ``./.logitwatch/logitwatch.db``."""
    return f"sqlite:///{Path('.logitwatch') / 'logitwatch.db'}"


class Settings(BaseSettings):
    """Configuration of one collector process."""

    model_config = SettingsConfigDict(env_prefix="LOGITWATCH_", extra="forbid")

    db_url: str = Field(
        default_factory=default_db_url,
        description="SQLAlchemy URL: sqlite:///path.db (default) or "
        "postgresql+psycopg://user:pw@host:5432/db.",
    )
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    webhook_url: str | None = Field(
        None, description="If set, every alert that fires or resolves is POSTed here as JSON."
    )
    webhook_timeout: float = Field(5.0, gt=0, description="Seconds per webhook attempt.")
    webhook_retries: int = Field(5, ge=0, description="Retries per webhook delivery.")
    pool_size: int = Field(
        5, ge=1, description="Database connections kept open (PostgreSQL); SQLite uses one."
    )
    stream_interval: float = Field(
        1.0, gt=0, description="Seconds between polls of the store by each live stream."
    )
    max_frames_per_request: int = Field(10_000, ge=1, description="Frames per ingest batch.")
    # Alert rule defaults (see server/alerts/rules.py for their meaning).
    alert_logit_threshold: float = Field(
        1000.0, gt=0, description="A head's max logit above this is alarming on any model."
    )
    alert_logit_factor: float = Field(
        3.0, gt=1, description="Max logit above factor x its own baseline is alarming."
    )
    alert_logit_floor: float = Field(
        10.0, ge=0, description="Relative alarms only above this absolute level."
    )
    alert_for_samples: int = Field(
        3, ge=1, description="Consecutive sampled steps a condition must hold before firing."
    )

    @field_validator("db_url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not (v.startswith("sqlite") or v.startswith("postgresql")):
            raise ValueError(
                f"db_url must be a sqlite:/// or postgresql+psycopg:// URL, got {v.split(':')[0]!r}"
            )
        return v
