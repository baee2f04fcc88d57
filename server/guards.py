"""Browser-facing guards: the Host names the collector answers to (DNS rebinding), who may
change state from a browser (CSRF), and who may frame its pages (clickjacking).

A page on ``evil.example`` can make a browser on the collector's machine send requests to
``127.0.0.1:8000`` by pointing its own name at 127.0.0.1 (DNS rebinding): the browser then
treats the collector as same-origin with the attacker's page, and an open-mode collector
(no tokens: every request allowed) serves it runs and takes its frames. What gives such a
request away is its ``Host`` header, which names the attacker's domain. So every request
must name the collector: a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``) or the
bound address, or a name in ``allowed_hosts`` (``LOGITWATCH_ALLOWED_HOSTS``, comma-separated;
``*`` turns the check off). A collector bound to every interface (``0.0.0.0``, ``::``)
cannot know its names: it checks only when ``allowed_hosts`` is set (it needs tokens there
anyway, and a token is never sent to the attacker's name). Behind a proxy that passes the
public name on (Caddy does), add that name.

A page of another site can also make the browser *send* requests (a form posted to
``/api/v1/alerts/1/ack``) without reading the answers; with no tokens (open mode) nothing
else stops them, and the SameSite=Strict session cookie does not stop a page of another
port of the same host. So (:class:`CsrfCheck`) a request that changes state (POST, PUT,
PATCH, DELETE) whose ``Origin`` is not the collector itself (the ``Host`` it was sent to,
port included, or a name of ``allowed_hosts``) is refused with 403 ``cross-origin``, and a
POST must be one that a form cannot send: ``Content-Type: application/json`` or an
``Authorization`` header (PUT and DELETE never go cross-origin without a preflight, which
the collector never grants). Ingest refuses anything but JSON itself.

Pages cannot be framed by another site (:class:`FrameHeaders`): every answer carries
``X-Frame-Options: DENY``, ``Content-Security-Policy: frame-ancestors 'none'`` and
``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from logitwatch.server.errors import refuse
from logitwatch.server.settings import Settings

__all__ = ["CsrfCheck", "FrameHeaders", "HostCheck", "allowed_hosts", "host_name"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The host names a request may name (lower case, no port), or None: any."""
    raw = settings.allowed_hosts
    if raw is not None and raw.strip():
        names = {n.strip().lower().strip("[]") for n in raw.split(",") if n.strip()}
        if "*" in names:
            return None
        return frozenset(names | LOOPBACK_NAMES)
    bound = settings.host.strip().lower().strip("[]")
    if bound in WILDCARD_BINDS:
        return None
    return frozenset(LOOPBACK_NAMES | {bound})


def host_name(value: str) -> str:
    """The name of a ``Host`` header, lower case, without port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware: 421 ``host-not-allowed`` to a request whose ``Host`` is not one of
    the collector's names (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == b"host"), None)
        name = host_name(raw.decode("latin-1")) if raw is not None else ""
        if raw is None or name in self.allowed or _is_loopback_ip(name):
            await self.app(scope, receive, send)
            return
        shown = raw.decode("latin-1")[:100]
        await refuse(
            send, 421, "host-not-allowed",
            f"Host: {shown!r} is not a name of this collector (it answers to "
            f"{', '.join(sorted(self.allowed))}). A page of another site may be pointing its "
            "name at this collector (DNS rebinding). If this is the collector's own name "
            "(e.g. behind a proxy), add it to LOGITWATCH_ALLOWED_HOSTS.")


UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORT = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _netloc(value: str, scheme: str) -> tuple[str, int]:
    """``(name, port)`` of a ``Host`` value or an origin's authority."""
    name = host_name(value)
    value = value.strip()
    port_text = value.rsplit("]", 1)[1] if value.startswith("[") else (
        value if value.count(":") == 1 else "")
    _, _, port = port_text.rpartition(":")
    try:
        return name, int(port) if port else _DEFAULT_PORT.get(scheme, 80)
    except ValueError:
        return name, -1


class CsrfCheck:
    """ASGI middleware: 403 to a state-changing request from another origin, or to a POST
    that a plain form could send (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        raw = settings.allowed_hosts or ""
        self.names = frozenset(n.strip().lower().strip("[]") for n in raw.split(",")
                               if n.strip() and n.strip() != "*")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"origin", b"host", b"content-type", b"authorization")}
        origin = headers.get("origin")
        if origin is not None and not self._same(origin, headers.get("host", ""),
                                                 scope.get("scheme", "http")):
            await refuse(
                send, 403, "cross-origin",
                f"Origin: {origin[:100]!r} is not this collector: a page of another site "
                "cannot change anything here (nothing was done). If it is the collector's own "
                "public name (behind a proxy that rewrites Host), add it to "
                "LOGITWATCH_ALLOWED_HOSTS.")
            return
        if scope["method"] == "POST" and scope["path"] != "/api/v1/ingest":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            json_body = kind == "application/json" or (kind.startswith("application/")
                                                        and kind.endswith("+json"))
            if not json_body and "authorization" not in headers:
                await refuse(
                    send, 403, "form-post-forbidden",
                    "Content-Type: send 'application/json' (or an Authorization header): a "
                    "plain form post, which any page can make a browser send, changes "
                    "nothing here (nothing was done)")
                return
        await self.app(scope, receive, send)

    def _same(self, origin: str, host: str, scheme: str) -> bool:
        scheme_o, sep, authority = origin.strip().partition("://")
        if not sep or not authority or "/" in authority:
            return False  # "null" (a sandboxed frame, a file), or not an origin at all
        scheme_o = scheme_o.lower()
        name, port = _netloc(authority, scheme_o)
        if name in self.names:
            return True
        return bool(host) and (name, port) == _netloc(host, scheme_o)


FRAME_HEADERS = [(b"x-frame-options", b"DENY"),
                 (b"content-security-policy", b"frame-ancestors 'none'"),
                 (b"x-content-type-options", b"nosniff")]


class FrameHeaders:
    """ASGI middleware: no page of the collector may be framed by another site."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in FRAME_HEADERS if k not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
