"""Domain errors with stable ``code`` strings, rendered as ``{"code", "message"}``."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "BadRequest", "Conflict", "NotFound", "ServiceUnavailable"]


class ApiError(Exception):
    """Base class: an HTTP status, a stable machine-readable code and a human message."""

    status = 500

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra

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
