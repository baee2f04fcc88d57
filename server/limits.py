"""Size limits: the request body (413, counted while reading) and the arrays in a batch.

A body sent with ``Content-Encoding: gzip`` is decompressed here, under the same limit:
the compressed bytes are counted while reading, and the decompressed bytes may not exceed
``max_request_bytes`` either (413, whatever the compression ratio), so a small "zip bomb"
cannot make the collector inflate gigabytes. The app then sees a plain body.

Each limit is a documented :class:`~logitwatch.server.settings.Settings` field, and each
refusal names the field or setting it hit. The metric-cardinality limit needs the store and
lives in ``store/ingest.py``.
"""

from __future__ import annotations

import json
import zlib

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from logitwatch.server.errors import BadRequest
from logitwatch.server.schemas import IngestIn
from logitwatch.server.settings import Settings

__all__ = ["BodyLimit", "check_batch"]


class BodyLimit:
    """ASGI middleware: answer 413 ``request-too-large`` to a body over ``max_bytes``.

    Content-Length is checked first; the body is then counted while it is read (a chunked
    body, or a Content-Length that lies, cannot get past), and handed to the app only once
    it is known to fit, so the app never sees a partial body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await _refuse(send, 400, "bad-content-length",
                              "Content-Length: not a non-negative integer")
                return
            if declared > self.max_bytes:
                await self._too_large(send)
                return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") and length is None:
            await self.app(scope, receive, send)
            return
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
                if size > self.max_bytes:
                    await self._too_large(send)
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    done = True
                    break
        if not done:
            await _refuse(send, 408, "request-timeout",
                          f"request body: not received within {self.body_timeout:g} s "
                          "(body_timeout); nothing was stored")
            return
        body = b"".join(chunks)
        headers = dict(scope["headers"])
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"", b"identity"):
            if encoding != b"gzip":
                await _refuse(send, 415, "unsupported-encoding",
                              f"Content-Encoding: {encoding.decode('latin-1')!r} is not "
                              "supported; send gzip or an uncompressed body (nothing was "
                              "stored)")
                return
            try:
                body = await anyio.to_thread.run_sync(gunzip, body, self.max_bytes)
            except _TooLarge:
                await self._too_large(send, decompressed=True)
                return
            except ValueError as e:
                await _refuse(send, 400, "bad-gzip",
                              f"request body: not a valid gzip stream ({e}); nothing was stored")
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

    async def _too_large(self, send: Send, decompressed: bool = False) -> None:
        what = "request body, decompressed," if decompressed else "request body:"
        await _refuse(
            send, 413, "request-too-large",
            f"{what} larger than {self.max_bytes} bytes (max_request_bytes); send "
            "fewer frames per batch (nothing was stored)",
        )


class _TooLarge(Exception):
    pass


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """Decompress a gzip body (several members allowed) to at most ``max_bytes`` bytes.

    Raises ``_TooLarge`` past the limit (without inflating more than ``max_bytes + 1``
    bytes) and ``ValueError`` for a corrupt or truncated stream.
    """
    out: list[bytes] = []
    size = 0
    rest = data
    while True:
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, max_bytes - size + 1)
        except zlib.error as e:
            raise ValueError(str(e)) from None
        size += len(chunk)
        if size > max_bytes or d.unconsumed_tail:
            raise _TooLarge
        out.append(chunk)
        if not d.eof:
            raise ValueError("truncated stream")
        rest = d.unused_data
        if not rest.strip(b"\0"):
            return b"".join(out)


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


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

