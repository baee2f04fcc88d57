"""Serving the collector with uvicorn, guarded against slow and piled-up connections.

uvicorn keeps a connection whose request headers never finish open for ever (its
keep-alive timeout only starts after a response), so a few hundred such connections
("slowloris") use up the process's file descriptors and every new request fails. Here
each connection must complete a request's headers within ``header_timeout`` seconds of
opening (or of its previous response), or it is closed; and past ``max_connections`` open
connections (bounded below the open-file limit) a new connection closes the oldest one
that has no request in progress (else the oldest whose request body is still arriving: a
trickled body cannot hold a connection for ever either), so slow or idle connections can
never lock real clients out. ``limit_concurrency`` (uvicorn's) answers 503 past that many
requests in progress; a request body must arrive within ``body_timeout`` (``limits.BodyLimit``,
408).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from typing import Any

from logitwatch.server.settings import Settings

__all__ = ["PortInUse", "check_port", "connection_limit", "guarded_protocol", "serve"]

log = logging.getLogger("logitwatch.server")

#: File descriptors kept for the database, log files and the like.
SPARE_FDS = 64


class PortInUse(OSError):
    """The collector's address cannot be bound; the message says what to do."""


def check_port(host: str, port: int) -> None:
    """Bind ``host:port`` once, as uvicorn will, and let it go: a port already in use (or an
    address this machine does not have) is reported before the collector starts.

    Raises:
        PortInUse: the address cannot be bound; the message names it and the way out.
    """
    if port == 0:
        return  # any free port: the system picks one that binds
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise PortInUse(f"cannot listen on {host!r}: {e.strerror} (--host takes an address "
                        "or a name of this machine, e.g. 127.0.0.1)") from e
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} on {host} is already in use (another `logitwatch serve` or "
                    f"the demo?): stop that process, or pass another --port (0: any free "
                    "port)") from e
            raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror}") from e


def connection_limit(settings: Settings) -> int:
    """``max_connections``, lowered to fit the process's open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return settings.max_connections
    return max(8, min(settings.max_connections, soft - SPARE_FDS))


def _idle(protocol: Any) -> bool:
    """No request in progress: none yet, or the last one answered."""
    cycle = getattr(protocol, "cycle", None)
    return cycle is None or bool(getattr(cycle, "response_complete", True))


def _receiving(protocol: Any) -> bool:
    """A request whose body is still arriving, not yet answered (a slow upload)."""
    cycle = getattr(protocol, "cycle", None)
    return (cycle is not None and bool(getattr(cycle, "more_body", False))
            and not getattr(cycle, "response_started", True))


def guarded_protocol(base: type[Any], *, header_timeout: float,
                     max_connections: int) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` with the header timeout and the
    connection bound of the module docstring."""

    class Guarded(base):  # type: ignore[misc, valid-type]
        _since = 0.0
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()
            if len(self.connections) > max_connections:
                others = [c for c in self.connections if c is not self]
                idle = [c for c in others if _idle(c)] or [c for c in others if _receiving(c)]
                victim = min(idle, key=lambda c: getattr(c, "_since", 0.0)) if idle else self
                log.warning("%d connections open (max_connections %d): closing the oldest "
                            "with no request in progress, else the oldest still sending its "
                            "body", len(self.connections), max_connections)
                victim.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._since = self.loop.time()
            self._timer = self.loop.call_later(header_timeout, self._expire)

        def _expire(self) -> None:
            self._timer = None
            if _idle(self) and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _base_protocol() -> type[Any]:
    try:  # what uvicorn's http="auto" picks
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - depends on the install
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def serve(app: Any, settings: Settings, *, log_level: str = "info") -> None:
    """Run ``app`` with uvicorn on ``settings.host:settings.port``, guarded."""
    import uvicorn

    limit = connection_limit(settings)
    protocol = guarded_protocol(_base_protocol(), header_timeout=settings.header_timeout,
                                max_connections=limit)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level,
                http=protocol, timeout_keep_alive=int(max(1, settings.keep_alive_timeout)),
                limit_concurrency=settings.limit_concurrency)
