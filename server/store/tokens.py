"""API tokens: created, listed, revoked, looked up by hash.

A token is ``lw_`` + 43 URL-safe characters (256 random bits). Only its SHA-256 is stored.
A slow password hash (bcrypt, argon2) protects *guessable* secrets from an offline search;
a uniformly random 256-bit secret cannot be guessed, so one fast SHA-256 is as safe here and
keeps the per-request lookup cheap (an indexed equality on the hash).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Token
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.wire import NAME_RE

__all__ = [
    "SCOPES",
    "TOKEN_PREFIX",
    "NewToken",
    "TokenInfo",
    "count_tokens",
    "create_token",
    "find_token",
    "hash_token",
    "list_tokens",
    "revoke_token",
    "touch_token",
]

TOKEN_PREFIX = "lw_"
SCOPES = ("ingest", "read")
_SHOWN = 10  # characters of the token kept as its display prefix ("lw_" + 7)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What the collector knows of a token (never the secret)."""

    id: int
    project: str
    scope: str
    name: str
    prefix: str
    created_at: float
    revoked_at: float | None
    last_used_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class NewToken:
    """A token just created: the secret, shown once, and its record."""

    secret: str
    info: TokenInfo


def hash_token(secret: str) -> str:
    """SHA-256 hex of a token secret: what the database stores and looks up."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _info(t: Token) -> TokenInfo:
    return TokenInfo(id=t.id, project=t.project, scope=t.scope, name=t.name, prefix=t.prefix,
                     created_at=t.created_at, revoked_at=t.revoked_at,
                     last_used_at=t.last_used_at)


def create_token(session: Session, *, project: str, scope: str, name: str = "") -> NewToken:
    """Create a token of ``scope`` for ``project``; the returned secret is never stored."""
    if scope not in SCOPES:
        raise BadRequest("bad-scope", f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if not NAME_RE.fullmatch(project):
        raise BadRequest("bad-project",
                         f"project must be 1-128 characters of [A-Za-z0-9._:-], got {project!r}")
    if len(name) > 128:
        raise BadRequest("bad-name", "name: at most 128 characters")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = Token(project=project, scope=scope, name=name or f"{project}-{scope}",
                token_hash=hash_token(secret), prefix=secret[:_SHOWN], created_at=time.time())
    session.add(row)
    session.flush()
    return NewToken(secret=secret, info=_info(row))


def list_tokens(session: Session, *, project: str | None = None) -> list[TokenInfo]:
    q = select(Token).order_by(Token.id)
    if project is not None:
        q = q.where(Token.project == project)
    return [_info(t) for t in session.scalars(q)]


def revoke_token(session: Session, *, token_id: int) -> TokenInfo:
    """Revoke a token (idempotent); the row stays for the record."""
    row = session.get(Token, token_id)
    if row is None:
        raise NotFound("token-not-found", f"no token with id {token_id}")
    if row.revoked_at is None:
        row.revoked_at = time.time()
        session.flush()
    return _info(row)


def find_token(session: Session, *, secret: str) -> TokenInfo | None:
    """The token with this secret, active or revoked, or None."""
    row = session.scalar(select(Token).where(Token.token_hash == hash_token(secret)))
    return None if row is None else _info(row)


def count_tokens(session: Session, *, active_only: bool = False) -> int:
    """How many tokens exist (revoked ones too, unless ``active_only``)."""
    q = select(func.count()).select_from(Token)
    if active_only:
        q = q.where(Token.revoked_at.is_(None))
    return int(session.scalar(q) or 0)


def touch_token(session: Session, *, token_id: int, now: float) -> None:
    session.execute(update(Token).where(Token.id == token_id).values(last_used_at=now))
