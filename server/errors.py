"""Domain errors with stable ``code`` strings, rendered as ``{"code", "message"}``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import Send

__all__ = [
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ServiceUnavailable",
    "Unauthorized",
    "refuse",
]


class ApiError(Exception):
    """Base class: an HTTP status, a stable machine-readable code and a human message."""

    status = 500

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
        #: Response headers (``WWW-Authenticate``, ``Retry-After``, ...).
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


class BadRequest(ApiError):
    status = 422


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    status = 409


class ServiceUnavailable(ApiError):
    status = 503


class Unauthorized(ApiError):
    """No credentials, or credentials that name no active token."""

    status = 401

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(code, message, **extra)
        self.headers["WWW-Authenticate"] = 'Bearer realm="logitwatch"'


class Forbidden(ApiError):
    """A valid token that may not do this (wrong scope, another project's frames)."""

    status = 403


class PayloadTooLarge(ApiError):
    status = 413


class RateLimited(ApiError):
    """Too many requests for one token; ``Retry-After`` says when to come back."""

    status = 429

    def __init__(self, code: str, message: str, *, retry_after: int, **extra: Any) -> None:
        super().__init__(code, message, **extra)
        self.headers["Retry-After"] = str(retry_after)


async def refuse(send: Send, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
    """Answer from ASGI middleware, before any route: ``{"code", "message"}`` with ``status``
    and ``headers``. The request's body may be left unread, so the connection is closed."""
    body = json.dumps({"code": code, "message": message}).encode()
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
             for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body})
