"""Browser-facing guards: which Host names the collector answers to (DNS rebinding).

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
"""

from __future__ import annotations

import ipaddress
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from logitwatch.server.settings import Settings

__all__ = ["HostCheck", "allowed_hosts", "host_name"]

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
        body = json.dumps({
            "code": "host-not-allowed",
            "message": f"Host: {shown!r} is not a name of this collector (it answers to "
                       f"{', '.join(sorted(self.allowed))}). A page of another site may be "
                       "pointing its name at this collector (DNS rebinding). If this is "
                       "the collector's own name (e.g. behind a proxy), add it to "
                       "LOGITWATCH_ALLOWED_HOSTS.",
        }).encode()
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
