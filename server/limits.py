"""Size limits: the request body (413, counted while reading) and the arrays in a batch.

A body sent with ``Content-Encoding: gzip`` is decompressed here, under the same limit:
the compressed bytes are counted while reading, and the decompressed bytes may not exceed
``max_request_bytes`` either (413, whatever the compression ratio), so a small "zip bomb"
cannot make the collector inflate gigabytes; a body of more than ``MAX_GZIP_MEMBERS`` gzip
members is refused (400 ``too-many-gzip-members``) before the rest are inflated. The app then
sees a plain body.

Nothing is read before the caller is known: when the collector requires tokens, a request
with a body and without a known, active token (``Authorization`` or the session cookie) is
answered 401 before one byte of its body is read, so without a token nobody can hold memory
or a connection with a slow or large body. (The dashboard's login, ``POST /api/v1/session``,
carries its token in a body of at most ``LOGIN_MAX_BYTES``.) All the bodies buffered at once
may take at most ``BUFFER_BUDGET_FACTOR`` x ``max_request_bytes``: past that a request is
answered 503 ``busy-buffering`` with Retry-After.

Each limit is a documented :class:`~logitwatch.server.settings.Settings` field, and each
refusal names the field or setting it hit. The metric-cardinality limit needs the store and
lives in ``store/ingest.py``.
"""

from __future__ import annotations

import zlib

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from logitwatch.server.errors import ApiError, BadRequest, refuse
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings

__all__ = ["BUFFER_BUDGET_FACTOR", "LOGIN_MAX_BYTES", "MAX_GZIP_MEMBERS", "BodyLimit",
           "check_batch"]

#: gzip members one body may hold (the project's client sends one).
MAX_GZIP_MEMBERS = 64
#: The body of ``POST /api/v1/session`` (a token): the one body read without a token.
LOGIN_MAX_BYTES = 4096
LOGIN_PATH = "/api/v1/session"
#: All request bodies buffered at once: at most this many times ``max_request_bytes``.
BUFFER_BUDGET_FACTOR = 8
#: Compressed bytes fed to zlib at once: at most this much is copied at a member's end.
_FEED = 64 * 1024


class BodyLimit:
    """ASGI middleware: answer 413 ``request-too-large`` to a body over ``max_bytes``.

    Content-Length is checked first, then the caller's token (401 before the body is read,
    see the module docstring), then the budget of bytes buffered at once (``max_buffered``,
    503 ``busy-buffering``); the body is then counted while it is read (a chunked body, or a
    Content-Length that lies, cannot get past), and handed to the app only once it is known
    to fit, so the app never sees a partial body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout: float | None = None,
                 max_buffered: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout
        self.max_buffered = max_buffered or BUFFER_BUDGET_FACTOR * max_bytes
        #: bytes of the budget reserved now (one event loop: no lock needed)
        self.buffered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        declared = -1
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await refuse(send, 400, "bad-content-length",
                             "Content-Length: not a non-negative integer")
                return
            if declared > self.max_bytes:
                await self._too_large(send)
                return
        if (scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") and length is None) \
                or declared == 0:
            await self.app(scope, receive, send)  # no body to read: the route checks the token
            return
        max_bytes = self.max_bytes
        try:
            if await self._login_without_token(scope):
                max_bytes = min(max_bytes, LOGIN_MAX_BYTES)
        except ApiError as e:
            await refuse(send, e.status, e.code, e.message, e.headers)
            return
        if declared > max_bytes:
            await self._too_large(send, limit=max_bytes)
            return
        held = _Held(self)
        try:
            if not held.cover(declared):
                await self._busy(send)
                return
            await self._read(scope, receive, send, max_bytes, held)
        finally:
            held.release()

    async def _login_without_token(self, scope: Scope) -> bool:
        """Before a body is read: raise the route's 401 (or 429) unless the collector is open
        or the request carries a known, active token. True for a login without a token."""
        auth = getattr(getattr(scope.get("app"), "state", None), "auth", None)
        if auth is None:  # a bare app (no lifespan): nothing to check against
            return False
        from logitwatch.server.api.deps import client_address, credentials

        request = Request(scope)
        if (scope["method"] == "POST" and scope["path"] == LOGIN_PATH
                and "authorization" not in request.headers):
            return True  # its token is in the body (a stale cookie must not stop a login)
        secret = credentials(request)  # 401 bad-authorization for a malformed header
        await anyio.to_thread.run_sync(auth.authenticate, secret, client_address(request))
        return False

    async def _read(self, scope: Scope, receive: Receive, send: Send, max_bytes: int,
                    held: _Held) -> None:
        chunks: list[bytes] = []
        size = 0
        done = False
        with anyio.move_on_after(self.body_timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_bytes:
                    await self._too_large(send, limit=max_bytes)
                    return
                if not held.cover(size):
                    await self._busy(send)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    done = True
                    break
        if not done:
            await refuse(send, 408, "request-timeout",
                         f"request body: not received within {self.body_timeout:g} s "
                         "(body_timeout); nothing was stored")
            return
        body = b"".join(chunks)
        del chunks
        headers = dict(scope["headers"])
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"", b"identity"):
            if encoding != b"gzip":
                await refuse(send, 415, "unsupported-encoding",
                             f"Content-Encoding: {encoding.decode('latin-1')!r} is not "
                             "supported; send gzip or an uncompressed body (nothing was "
                             "stored)")
                return
            try:
                body = await anyio.to_thread.run_sync(gunzip, body, max_bytes)
            except _TooLarge:
                await self._too_large(send, decompressed=True, limit=max_bytes)
                return
            except _TooManyMembers:
                await refuse(send, 400, "too-many-gzip-members",
                             f"request body: more than {MAX_GZIP_MEMBERS} gzip members; "
                             "send one gzip stream (nothing was stored)")
                return
            except ValueError as e:
                await refuse(send, 400, "bad-gzip",
                             f"request body: not a valid gzip stream ({e}); nothing was stored")
                return
            if not held.cover(len(body)):
                await self._busy(send)
                return
            headers.pop(b"content-encoding", None)
            headers[b"content-length"] = str(len(body)).encode()
            scope = {**scope, "headers": list(headers.items())}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, decompressed: bool = False,
                         limit: int | None = None) -> None:
        what = "request body, decompressed," if decompressed else "request body:"
        limit = self.max_bytes if limit is None else limit
        setting = "max_request_bytes" if limit == self.max_bytes else "a login's body"
        await refuse(
            send, 413, "request-too-large",
            f"{what} larger than {limit} bytes ({setting}); send "
            "fewer frames per batch (nothing was stored)",
        )

    async def _busy(self, send: Send) -> None:
        await refuse(
            send, 503, "busy-buffering",
            f"the collector is already buffering {self.buffered} bytes of request bodies, "
            f"its budget is {self.max_buffered} ({BUFFER_BUDGET_FACTOR} x max_request_bytes): "
            "retry after the Retry-After seconds (nothing was stored)",
            {"Retry-After": "2"},
        )


class _Held:
    """The bytes of :attr:`BodyLimit.buffered` one request holds; given back once."""

    def __init__(self, limit: BodyLimit) -> None:
        self.limit, self.n = limit, 0

    def cover(self, total: int) -> bool:
        """Hold at least ``total`` bytes (more of the budget when it holds fewer); False,
        holding what it did, when the budget has not that much left."""
        more = total - self.n
        if more <= 0:
            return True
        if self.limit.buffered + more > self.limit.max_buffered:
            return False
        self.limit.buffered += more
        self.n = total
        return True

    def release(self) -> None:
        self.limit.buffered -= self.n
        self.n = 0


class _TooLarge(Exception):
    pass


class _TooManyMembers(Exception):
    pass


def gunzip(data: bytes, max_bytes: int, max_members: int = MAX_GZIP_MEMBERS) -> bytes:
    """Decompress a gzip body (at most ``max_members`` members) to at most ``max_bytes``.

    Raises ``_TooLarge`` past the limit (without inflating more than ``max_bytes + 1``
    bytes), ``_TooManyMembers`` at member ``max_members + 1`` (before inflating it) and
    ``ValueError`` for a corrupt or truncated stream. The input is fed in slices of a
    memoryview, so the end of a member copies at most one slice (``unused_data``), never the
    rest of the body: the work is linear in the body's size.
    """
    view = memoryview(data)
    out: list[bytes] = []
    size = 0
    pos = 0
    members = 0
    while True:
        members += 1
        if members > max_members:
            raise _TooManyMembers
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        while not d.eof:
            if pos >= len(view):
                raise ValueError("truncated stream")
            piece = view[pos:pos + _FEED]
            pos += len(piece)
            try:
                chunk = d.decompress(piece, max_bytes - size + 1)
            except zlib.error as e:
                raise ValueError(str(e)) from None
            size += len(chunk)
            if size > max_bytes or d.unconsumed_tail:
                raise _TooLarge
            out.append(chunk)
        pos -= len(d.unused_data)
        if pos >= len(view) or (view[pos] == 0 and not data[pos:].strip(b"\0")):
            return b"".join(out)  # the end, or zero padding after the last member


def check_batch(batch: IngestIn, settings: Settings) -> None:
    """Refuse a batch whose arrays exceed the configured limits (422, the field named).

    The schema holds hard ceilings (in the OpenAPI document); these are the deployment's
    own, possibly lower, limits.
    """
    if len(batch.frames) > settings.max_frames_per_request:
        raise BadRequest(
            "too-many-frames",
            f"frames: {len(batch.frames)} frames in one batch, at most "
            f"{settings.max_frames_per_request} (max_frames_per_request); nothing was stored",
            field="frames",
        )
    for i, f in enumerate(batch.frames):
        for name, rows in f.heads.items():
            n = len(rows) * len(rows[0])
            if n > settings.max_values_per_matrix:
                field = f"frames.{i}.heads.{name}"
                raise BadRequest(
                    "matrix-too-large",
                    f"{field}: {n} values, at most {settings.max_values_per_matrix} "
                    "(max_values_per_matrix); nothing was stored",
                    field=field,
                )

